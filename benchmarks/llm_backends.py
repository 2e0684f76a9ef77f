"""The LLM-eval backends at scale: 100,000 rollouts to TensorBoard, and LangSmith and Phoenix at
the largest sizes that fit a session (rollouts as MLflow and Phoenix traces: benchmarks/traces.py).

TensorBoard: one post-run export of 100,000 rollouts (~200 MB), wall time, peak RSS above the
imports and the event file's size, against copying the rollouts file. LangSmith (the local endpoint of
tests/langsmith_api.py, driven by the real client) and Phoenix (a real ``phoenix serve``) are
request-bound: each is measured at two sizes, so the memory figures say whether it grows with rows.

``GYM_BENCH_LLM=tensorboard,langsmith,phoenix`` picks parts (default: all; ``--tiny``
leaves out Phoenix);
``GYM_BENCH_LLM_ROWS`` overrides the TensorBoard size (default 100,000).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks.common import Row, make_run, run_measured, write_rollouts
from benchmarks.large_export import _copy_baseline, _ours

ROWS = 100_000
LANGSMITH_ROWS = (10_000, 100_000)
PHOENIX_ROWS = (500, 10_000)
PARTS = ("tensorboard", "langsmith", "phoenix")

MEASURED = """
import time
from omegaconf import OmegaConf
from gym_artifacts import export_run
import gym_artifacts.run.identity, {imports}
__base = peak_rss_mb()
cfg = OmegaConf.create({{'exporters': {section!r}}})
t = time.perf_counter()
[r] = export_run({out!r}, cfg)
assert r.status.value == 'EXPORTED', r.reason
__result['wall'] = time.perf_counter() - t
__result['base_rss_mb'] = __base
__result['above_mb'] = peak_rss_mb() - __base
"""

def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def _export(out: Path, section: dict, imports: str) -> dict:
    """A cold post-run export of ``out`` in a fresh process: wall time, RSS above the imports."""
    out.with_name(f".{out.stem}.gymart-identities.json").unlink(missing_ok=True)
    for receipt in out.parent.glob(f"{out.stem}_*_export_done.json"):
        receipt.unlink()
    return run_measured(MEASURED.format(imports=imports, section=section, out=str(out)))


def _rollouts_run(dpath: Path, rows: int) -> Path:
    out = make_run(dpath, 2000, 1_000)  # aggregate metrics and a tiny recording
    write_rollouts(out, rows)
    stamp = out.with_name("run_aggregate_metrics.json").stat().st_mtime - 1
    os.utime(out, (stamp, stamp))
    return out


def _tensorboard(tmp: Path, out: Path, n_rows: int) -> list[Row]:
    logdir = tmp / "tb"
    tb = _ours(out, {"tensorboard": {"enabled": True, "logdir": str(logdir)}})
    copy = _copy_baseline(out, tmp / "copy.jsonl")
    return [
        Row(
            f"export: {n_rows:,} rollouts to TensorBoard",
            f"{tb['wall']:.2f} s, +{tb['above_mb']:.0f} MB, events {_dir_mb(logdir):.0f} MB",
            f"copy {copy['wall']:.2f} s",
            tb["wall"] / copy["wall"],
            "<= 5x copy, <= 150 MB (memory constant in rows)",
            tb["wall"] / copy["wall"] <= 5 and tb["above_mb"] <= 150,
            tb["above_mb"] + tb["base_rss_mb"],
        )
    ]


def _request_bound(name: str, sizes: tuple[int, ...], tmp: Path, section_for, imports: str) -> list[Row]:
    """One export per size; the per-rollout cost and the memory above the imports at each."""
    results = {}
    for n in sizes:
        out = _rollouts_run(tmp / f"{name}-{n}", n)
        results[n] = _export(out, {name: section_for(n)}, imports)
    small, large = sizes[0], sizes[-1]
    lo, hi = results[small], results[large]
    per = hi["wall"] / large
    return [
        Row(
            f"export: {large:,} rollouts to {name}",
            f"{hi['wall']:.1f} s, {per * 1000:.1f} ms a rollout, +{hi['above_mb']:.0f} MB",
            f"{small:,} rollouts: {lo['wall']:.1f} s, +{lo['above_mb']:.0f} MB",
            (hi["wall"] / large) / (lo["wall"] / small),
            "memory: growth from the small to the large size",
            None,
            hi["above_mb"] + hi["base_rss_mb"],
        )
    ]


def _langsmith(tmp: Path, tiny: bool) -> list[Row]:
    from tests.langsmith_api import LangsmithApi

    api = LangsmithApi().start()
    try:
        section = {"enabled": True, "api_url": api.url, "api_key": "bench-key"}
        sizes = (20, 50) if tiny else LANGSMITH_ROWS
        return _request_bound("langsmith", sizes, tmp, lambda n: section, "langsmith")
    finally:
        api.stop()


def _phoenix(tmp: Path, tiny: bool) -> list[Row]:
    from tests.phoenix_server import PhoenixServer, phoenix_bin

    binary = phoenix_bin()
    if binary is None:
        return [Row("export to Phoenix", "skipped: no phoenix binary", "", None, "", None)]
    server = PhoenixServer(tmp / "phoenix", binary).start()
    try:
        section = {"enabled": True, "base_url": server.url}
        sizes = (20, 100) if tiny else PHOENIX_ROWS
        return _request_bound("phoenix", sizes, tmp, lambda n: section, "phoenix.client")
    finally:
        server.stop()


def run(tiny: bool) -> list[Row]:
    # --tiny (the harness test) leaves out Phoenix: starting `phoenix serve` alone takes minutes
    default = PARTS[:2] if tiny else PARTS
    parts = [p for p in os.environ.get("GYM_BENCH_LLM", ",".join(default)).split(",") if p]
    n_rows = 100 if tiny else int(os.environ.get("GYM_BENCH_LLM_ROWS", ROWS))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-llm-") as tmp_name:
        tmp = Path(tmp_name)
        if "tensorboard" in parts:
            out = make_run(tmp / "run", n_rows * 2000, 1_000)
            n_rows = out.read_bytes().count(b"\n")
            rows += _tensorboard(tmp, out, n_rows)
        if "langsmith" in parts:
            rows += _langsmith(tmp, tiny)
        if "phoenix" in parts:
            rows += _phoenix(tmp, tiny)
    return rows
