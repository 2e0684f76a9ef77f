"""Real fragmented MP4 made with PyAV, for tests and the quickstart example."""

from __future__ import annotations

from pathlib import Path


def write_dash_chunks(
    dpath: Path, frames: int = 30, fps: int = 10, width: int = 64, height: int = 48
) -> list[Path]:
    """Encode ``frames`` frames as ``init.mp4`` + ``chunk_<n>.m4s`` (one-second fragments).

    Frame ``i`` is a flat grey of level ``(i * 8) % 256``, so decoded frames can be told apart.
    """
    import av
    import numpy as np

    dpath.mkdir(parents=True, exist_ok=True)
    options = {
        "seg_duration": "1", "use_template": "1", "use_timeline": "0",
        "init_seg_name": "init.mp4", "media_seg_name": "chunk_$Number$.m4s",
    }  # fmt: skip
    out = av.open(str(dpath / "manifest.mpd"), mode="w", format="dash", options=options)
    stream = out.add_stream("libx264", rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.gop_size = fps
    for i in range(frames):
        pixels = np.full((height, width, 3), (i * 8) % 256, dtype=np.uint8)
        for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    (dpath / "manifest.mpd").unlink()
    return sorted(dpath.glob("chunk_*.m4s"), key=lambda p: int(p.stem.split("_")[1]))


def write_recording(fpath: Path, frames: int = 30, fps: int = 10) -> None:
    """A complete fragmented MP4: the init segment followed by every chunk."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        chunks = write_dash_chunks(Path(tmp), frames=frames, fps=fps)
        with open(fpath, "wb") as out:
            out.write((Path(tmp) / "init.mp4").read_bytes())
            for chunk in chunks:
                out.write(chunk.read_bytes())


def decode_frame_count(fpath: Path) -> int:
    """How many video frames PyAV decodes from the file."""
    import av

    with av.open(str(fpath)) as container:
        return sum(1 for _ in container.decode(video=0))
