"""Soak: one million live metric calls with a failing backend: memory stays bounded, the process
exits promptly."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[2]

SOAK = textwrap.dedent(
    """
    import json, sys, time
    from benchmarks.common import peak_rss_mb
    from gym_artifacts.contract import registry
    from gym_artifacts.live import live_run
    from tests.backends import FailingLive
    registry.register(FailingLive)
    out, calls = sys.argv[1], int(sys.argv[2])
    base = peak_rss_mb()
    started = time.monotonic()
    with live_run({"exporters": {"failing": {"enabled": True}}}, out, teardown_timeout=5) as live:
        metrics = {"loss": 0.5, "reward": 0.25}
        for step in range(calls):
            live.export_metrics(metrics, step=step)
        loop = time.monotonic() - started
    report = live.reports[0]
    print(json.dumps({"base_mb": base, "peak_mb": peak_rss_mb(), "loop_s": loop, "failed": report.failed,
                      "attempts": live.channels[0].stats.failed_attempts,
                      "dropped": report.dropped, "undelivered": report.undelivered,
                      "journal_lost": live.journal_lost}), flush=True)
    """
)


@pytest.mark.slow
def test_a_million_calls_with_a_failing_backend(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    started = time.monotonic()
    proc = run_bounded([sys.executable, "-c", SOAK, str(tmp_path / "eval.jsonl"), "1000000"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"soak: {result}, wall {wall:.1f} s")
    assert result["peak_mb"] - result["base_mb"] < 300, result  # bounded: the queues are bounded
    assert result["attempts"] < 50  # backed off, never a tight retry loop
    assert (
        result["failed"] + result["dropped"] + result["undelivered"] >= 1_000_000 - 10
    )  # every call accounted for
    assert wall < result["loop_s"] + 30  # exits promptly after the eval
    journal_lines = (tmp_path / "eval_metrics.jsonl").read_bytes().count(b"\n")
    assert journal_lines + result["journal_lost"] == 1_000_000
