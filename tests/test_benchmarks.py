"""The benchmark harness runs end to end on tiny sizes (figures are not asserted: see BENCHMARKS.md).

One test per group of benchmarks, so that the suite's workers share them out (the whole harness
in one test held a worker for 6-10 minutes, most of it waiting on servers); together the groups
cover every benchmark the harness knows, which a test checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent

# Each group: the benchmarks run together, and row names each must print.
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "traces": (("traces",), ("traces: 40 rollouts to an mlflow server",)),
    "live-traces": (("live_traces",), ("live traces: export_rollouts caller's cost",)),
    "large-export": (("large_export",), ("export: 1,000 rollouts to local",
                                         "export: 1,000 rollouts to MLflow server")),
    "ray-scale": (("ray_scale",), ("scale: 2 small runs, --jobs 2", "scale: MLflow server (1 worker) capacity")),
    "live": (("live", "tail", "gc_backlog"), ("live: export_metrics median", "tail (a) local only, threads",
                                              "gc: full collection with a")),
    "files": (("identity", "recording", "snapshot", "nvml", "startup", "llm_backends"),
              ("identity: JSONL", "re-export: SKIPPED check", "recording: ", "snapshot copy of", "nvml: 10 Hz",
               "start-up: gym-artifacts exporters", "export: 100 rollouts to TensorBoard")),
}  # fmt: skip


def test_the_groups_cover_every_benchmark() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.__main__ import BENCHMARKS

    grouped = [name for modules, _ in GROUPS.values() for name in modules]
    assert sorted(grouped) == sorted(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
def test_harness_runs_on_tiny_sizes(group: str) -> None:
    modules, names = GROUPS[group]
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = run_bounded(
        [sys.executable, "-m", "benchmarks", "--tiny", "--only", *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in names:
        assert name in proc.stdout, name
    assert "harness peak RSS" in proc.stdout
