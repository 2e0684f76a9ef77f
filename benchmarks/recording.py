"""Recording assembly of many chunks against ``cat init.mp4 chunk_* > out`` on the same files."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import Row, mb, timed, write_random


def run(tiny: bool) -> list[Row]:
    from gym_artifacts.runtime.recording import assemble_recording

    chunks, chunk_size = (20, 500_000) if tiny else (100, 10_000_000)
    with tempfile.TemporaryDirectory(prefix="gymart-bench-rec-") as tmp_name:
        tmp = Path(tmp_name)
        session = tmp / "session"
        session.mkdir()
        write_random(session / "init.mp4", 1000)
        for i in range(1, chunks + 1):
            write_random(session / f"chunk_{i}.m4s", chunk_size)
        names = " ".join(f"chunk_{i}.m4s" for i in range(1, chunks + 1))

        def cat(sync: bool) -> None:
            target = tmp / "cat.mp4"
            target.unlink(missing_ok=True)
            subprocess.run(f"cat init.mp4 {names} > {target}", shell=True, check=True, cwd=session)
            if sync:
                fd = os.open(target, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)

        def ours(durable: bool) -> None:
            (tmp / "ours.mp4").unlink(missing_ok=True)
            assemble_recording(session, tmp / "ours.mp4", durable=durable)

        times: dict[str, list[float]] = {"cat": [], "cat+fsync": [], "ours": [], "ours durable": []}
        for _ in range(3):  # interleaved: disk write-back noise hits every variant alike
            times["cat"].append(timed(lambda: cat(False)))
            times["ours"].append(timed(lambda: ours(False)))
            times["cat+fsync"].append(timed(lambda: cat(True)))
            times["ours durable"].append(timed(lambda: ours(True)))
        best = {k: min(v) for k, v in times.items()}
        assert (tmp / "ours.mp4").read_bytes()[:1000] == (tmp / "cat.mp4").read_bytes()[:1000]
        total = chunks * chunk_size
    rate = {k: total / v / 1e6 for k, v in best.items()}
    return [
        Row(
            f"recording: {chunks} chunks, {mb(total)}",
            f"{rate['ours']:,.0f} MB/s",
            f"cat {rate['cat']:,.0f} MB/s",
            rate["ours"] / rate["cat"],
            ">= 0.9x cat",
            rate["ours"] / rate["cat"] >= 0.9,
        ),
        Row(
            "recording: durable (fsync before publish)",
            f"{rate['ours durable']:,.0f} MB/s",
            f"cat + fsync {rate['cat+fsync']:,.0f} MB/s",
            rate["ours durable"] / rate["cat+fsync"],
            ">= 0.9x cat + fsync",
            rate["ours durable"] / rate["cat+fsync"] >= 0.9,
        ),
    ]
