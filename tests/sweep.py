"""A sweep of small, distinct finished runs (as many evals leave on shared storage)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def make_sweep_run(dpath: Path, index: int, *, rows: int = 20, steps: int = 5, row_bytes: int = 200) -> Path:
    """Run ``index``: ``rows`` rollouts, ``steps`` journaled metric steps, aggregate metrics.

    Every run's content differs (its index is in each rollout and metric), so each has its own
    identity. Files are dated in the past, as a finished run's are.
    """
    dpath.mkdir(parents=True, exist_ok=True)
    out = dpath / "eval.jsonl"
    pad = "x" * max(0, row_bytes - 80)
    with open(out, "w") as fh:
        for i in range(rows):
            row = {"run": index, "task_index": i, "reward": (index + i) % 7 / 7, "response": pad}
            fh.write(json.dumps(row) + "\n")
    with open(dpath / "eval_metrics.jsonl", "w") as fh:
        for step in range(steps):
            metrics = {"train/reward": index + step / 10, "rollouts_done": step * rows}
            fh.write(json.dumps({"step": step, "time": 1_764_000_000 + step, "metrics": metrics}) + "\n")
    aggregate = [{"agent_ref": {"name": "agent"}, "agent_metrics": {"mean/reward": index / 1000}}]
    (dpath / "eval_aggregate_metrics.json").write_text(json.dumps(aggregate))
    old = time.time() - 120
    for name, age in (("eval.jsonl", 0), ("eval_metrics.jsonl", 0), ("eval_aggregate_metrics.json", 1)):
        os.utime(dpath / name, (old + age, old + age))
    return out


def make_sweep(root: Path, count: int, **sizes: int) -> list[Path]:
    """``count`` runs under ``root/run-NNNN/``; returns their rollouts paths."""
    return [make_sweep_run(root / f"run-{i:04d}", i, **sizes) for i in range(count)]
