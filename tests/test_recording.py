"""Recording assembly from real fragmented MP4 chunks made with PyAV, decoded back."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

pytest.importorskip("av")

from gym_artifacts.core.errors import RunError
from gym_artifacts.runtime.recording import assemble_recording
from tests.media import decode_frame_count, write_dash_chunks


@pytest.fixture
def twelve_chunks(tmp_path: Path) -> Path:
    session = tmp_path / "session"
    chunks = write_dash_chunks(session, frames=120, fps=10)  # one-second fragments: chunk_1 .. chunk_12
    assert [c.name for c in chunks][-1] == "chunk_12.m4s" and len(chunks) == 12
    return session


def frames_in(session: Path, indexes: list[int]) -> int:
    """Frames of the given chunks, decoded each on its own behind the init segment."""
    total = 0
    for i in indexes:
        probe = session.parent / f"probe_{i}.mp4"
        probe.write_bytes((session / "init.mp4").read_bytes() + (session / f"chunk_{i}.m4s").read_bytes())
        total += decode_frame_count(probe)
    return total


def test_chunks_assemble_in_index_order_with_a_gap(twelve_chunks: Path, tmp_path: Path) -> None:
    present = [i for i in range(1, 13) if i != 5]
    expected_frames = frames_in(twelve_chunks, present)
    (twelve_chunks / "chunk_5.m4s").unlink()
    dest = tmp_path / "out" / "recording.mp4"
    report = assemble_recording(twelve_chunks, dest)
    assert report.missing_indexes == [5]
    assert report.chunks == 11 and (report.first_index, report.last_index) == (1, 12)
    expected = (twelve_chunks / "init.mp4").read_bytes() + b"".join(
        (twelve_chunks / f"chunk_{i}.m4s").read_bytes() for i in present
    )
    assert dest.read_bytes() == expected  # chunk_10..12 after chunk_9, not after chunk_1
    assert decode_frame_count(dest) == expected_frames > 100
    assert report.bytes == len(expected)
    assert report.method in ("copy_file_range", "sendfile")


def test_ordering_past_99999(twelve_chunks: Path, tmp_path: Path) -> None:
    for i, new in zip(range(1, 4), (99_998, 99_999, 100_000), strict=True):
        (twelve_chunks / f"chunk_{i}.m4s").rename(twelve_chunks / f"chunk_{new}.m4s")
    for i in range(4, 13):
        (twelve_chunks / f"chunk_{i}.m4s").unlink()
    report = assemble_recording(twelve_chunks, tmp_path / "r.mp4")
    assert (report.first_index, report.last_index, report.missing_indexes) == (99_998, 100_000, [])
    assert decode_frame_count(tmp_path / "r.mp4") == 30


@pytest.mark.parametrize("broken", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_fallbacks_give_the_same_bytes(
    twelve_chunks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: list[str]
) -> None:
    reference = tmp_path / "ref.mp4"
    assemble_recording(twelve_chunks, reference)

    def unsupported(*_args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    for name in broken:
        monkeypatch.setattr(os, name, unsupported)
    report = assemble_recording(twelve_chunks, tmp_path / "fallback.mp4")
    assert report.method == ("sendfile" if broken == ["copy_file_range"] else "buffered")
    assert (tmp_path / "fallback.mp4").read_bytes() == reference.read_bytes()


def test_no_init_segment_is_an_error_and_publishes_nothing(twelve_chunks: Path, tmp_path: Path) -> None:
    (twelve_chunks / "init.mp4").unlink()
    with pytest.raises(RunError, match=r"no init\.mp4"):
        assemble_recording(twelve_chunks, tmp_path / "r.mp4")
    assert not (tmp_path / "r.mp4").exists()
