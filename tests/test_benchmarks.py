"""The benchmark harness runs end to end on tiny sizes (figures are not asserted: see BENCHMARKS.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_harness_runs_on_tiny_sizes() -> None:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = run_bounded(
        [sys.executable, "-m", "benchmarks", "--tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("live: export_metrics median", "tail (a) local only, threads", "identity: JSONL", "re-export: SKIPPED check", "export: ",
                 "recording: ", "nvml: 10 Hz", "start-up: gym-artifacts exporters",
                 "scale: 2 small runs, --jobs 2", "scale: MLflow server (1 worker) capacity",
                 "gc: full collection with a", "live traces: export_rollouts caller's cost"):  # fmt: skip
        assert name in proc.stdout, name
    assert "harness peak RSS" in proc.stdout
