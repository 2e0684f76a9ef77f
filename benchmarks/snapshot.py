"""Snapshot copies (no hard links): our kernel copy against a plain copy, and a whole local export
against a kernel copy (``shutil.copyfile``: ``sendfile`` on Linux, fsynced) of the same files."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import REPO, Row, mb, median, timed, write_random
from benchmarks.large_export import IMPORTS, _timed


def _fsynced_copy(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def _make_run(folder: Path, rows: int, recording_bytes: int) -> Path:
    """The quickstart run with ``rows`` rollouts and a random recording of the given size."""
    quickstart = REPO / "examples" / "quickstart"
    shutil.copytree(quickstart / "eval_artifacts", folder / "eval_artifacts")
    for name in ("eval_config.yaml", "eval_metrics.jsonl", "eval_aggregate_metrics.json"):
        shutil.copy(quickstart / name, folder / name)
    line = json.loads((quickstart / "eval.jsonl").read_text().splitlines()[0])
    with open(folder / "eval.jsonl", "w") as fh:
        for i in range(rows):
            line["bench_row"] = i
            fh.write(json.dumps(line) + "\n")
    write_random(folder / "eval_artifacts" / "recording.mp4", recording_bytes)
    (folder / "eval_aggregate_metrics.json").touch()
    return folder / "eval.jsonl"


def run(tiny: bool) -> list[Row]:
    from gym_artifacts import export_run
    from gym_artifacts.core.snapshot import snapshot_copy
    from gym_artifacts.run.artifacts import RunArtifacts

    size = 20_000_000 if tiny else 300_000_000
    rows, recording = (2_000, 5_000_000) if tiny else (50_000, 200_000_000)
    with tempfile.TemporaryDirectory(prefix="gymart-bench-snap-", dir=REPO) as tmp_name:
        tmp = Path(tmp_name)
        big = tmp / "big.bin"
        write_random(big, size)
        times: dict[str, list[float]] = {"ours": [], "plain": []}
        for i in range(3):  # interleaved: write-back noise hits both alike
            times["ours"].append(timed(lambda i=i: snapshot_copy(big, tmp / f"ours{i}.bin")))
            times["plain"].append(timed(lambda i=i: snapshot_copy(big, tmp / f"plain{i}.bin", method="read")))
        method_probe = tmp / "probe.bin"
        with open(big, "rb") as fin, open(method_probe, "wb") as fout:
            from gym_artifacts.core.snapshot import copy_into

            used = copy_into(fin, fout)
        for p in tmp.glob("*.bin"):
            p.unlink()

        run_dir = tmp / "run"
        run_dir.mkdir()
        out = _make_run(run_dir, rows, recording)
        run = RunArtifacts.from_path(out)
        files = list(run.artifact_files().values())
        total = sum(p.stat().st_size for p in files)
        # The export until its receipt: the report is built after it (see large_export's row).
        cfg = {"exporters": {"local": {"enabled": True, "root": str(tmp / "store"), "report": "off"}}}
        export_run(run, cfg)  # warms the identity cache: the figure is the copy, not the hashing

        def export_once() -> dict:
            """One export in a fresh process (its wall time and peak memory)."""
            run.export_done_fpath("local").unlink(missing_ok=True)
            shutil.rmtree(tmp / "store", ignore_errors=True)
            return _timed(
                f"cfg = OmegaConf.create({cfg!r})\n",
                f"[r] = export_run({str(out)!r}, cfg)\nassert r.status.value == 'EXPORTED', r.reason\n",
                IMPORTS["local"],
            )

        def kernel_copy() -> None:
            dest = tmp / "kcopy"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            for i, p in enumerate(files):
                _fsynced_copy(p, dest / f"{i}-{p.name}")

        exports, copy_times = [], []
        for _ in range(3):  # interleaved
            exports.append(export_once())
            copy_times.append(timed(kernel_copy))
    ours, plain = min(times["ours"]), min(times["plain"])
    walls = [e["wall"] for e in exports]
    exp, kcp = median(walls), median(copy_times)
    peak = max(e["above_mb"] + e["base_rss_mb"] for e in exports)
    return [
        Row(
            f"snapshot copy of {mb(size)} ({used})",
            f"{size / ours / 1e6:,.0f} MB/s",
            f"read/write copy {size / plain / 1e6:,.0f} MB/s",
            plain / ours,
            ">= 1.0x read/write",
            plain / ours >= 1.0,
        ),
        Row(
            f"local export, {rows:,} rows + {mb(recording)} recording ({mb(total)}), until the receipt",
            f"{exp:.2f} s ({min(walls):.2f}-{max(walls):.2f}, 3 runs)",
            f"kernel copy (sendfile+fsync) {kcp:.2f} s ({min(copy_times):.2f}-{max(copy_times):.2f})",
            kcp / exp,
            ">= 0.67x kernel copy (<= 1.5x its time)",
            kcp / exp >= 0.67,
            peak,
        ),
    ]
