"""The LLM-eval backends at scale: 100,000 rollouts to TensorBoard, and MLflow rollout traces.

TensorBoard: one post-run export of 100,000 rollouts (~200 MB), wall time, peak RSS above the
imports and the event file's size, against copying the rollouts file. MLflow traces: the same
run's export to a SQLite store with ``log_traces`` on and off (the difference is the traces'
cost); MLflow writes one trace per request, so this is measured on ``TRACE_ROWS`` rollouts and the
per-trace figures are stated with the 100,000-rollout projection.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Row, make_run
from benchmarks.large_export import _copy_baseline, _ours

TRACE_ROWS = 1_000


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def run(tiny: bool) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-llm-") as tmp_name:
        tmp = Path(tmp_name)
        out = make_run(tmp / "run", 2_000_000 if tiny else 200_000_000, 1_000)
        n_rows = out.read_bytes().count(b"\n")
        logdir = tmp / "tb"
        tb = _ours(out, {"tensorboard": {"enabled": True, "logdir": str(logdir)}})
        copy = _copy_baseline(out, tmp / "copy.jsonl")
        rows.append(
            Row(
                f"export: {n_rows:,} rollouts to TensorBoard",
                f"{tb['wall']:.2f} s, +{tb['above_mb']:.0f} MB, events {_dir_mb(logdir):.0f} MB",
                f"copy {copy['wall']:.2f} s",
                tb["wall"] / copy["wall"],
                "<= 150 MB (memory constant in rows)",
                tb["above_mb"] <= 150,
                tb["above_mb"] + tb["base_rss_mb"],
            )
        )
        trace_rows = 50 if tiny else TRACE_ROWS
        small = make_run(tmp / "small", trace_rows * 2000, 1_000)
        figures = {}
        for traces in (False, True):
            db = tmp / f"traces-{traces}.db"
            section = {"enabled": True, "tracking_uri": f"sqlite:///{db}", "experiment_name": "bench"}
            figures[traces] = _ours(small, {"mlflow": {**section, "log_traces": traces}})
            figures[traces]["db_mb"] = db.stat().st_size / 1e6
        on, off = figures[True], figures[False]
        per_trace = (on["wall"] - off["wall"]) / trace_rows
        per_trace_kb = (on["db_mb"] - off["db_mb"]) * 1000 / trace_rows
        rows.append(
            Row(
                f"export: {trace_rows:,} rollouts as MLflow traces (SQLite)",
                f"{on['wall']:.1f} s, +{on['above_mb']:.0f} MB, db {on['db_mb']:.1f} MB; "
                f"{per_trace * 1000:.0f} ms and {per_trace_kb:.1f} KB a trace "
                f"(100,000: ~{per_trace * 100_000 / 60:.0f} min, ~{per_trace_kb * 100:.0f} MB)",
                f"without traces {off['wall']:.1f} s, db {off['db_mb']:.1f} MB",
                on["wall"] / off["wall"],
                "memory constant in rows (batches of 100)",
                on["above_mb"] - off["above_mb"] <= 50,
                on["above_mb"] + on["base_rss_mb"],
            )
        )
    return rows
