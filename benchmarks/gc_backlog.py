"""Garbage collection with a dead backend's backlog: a full collection costs about what it costs
over an empty queue, not what walking the backlog's calls would (DESIGN: queued calls are not
tracked containers).

Measured in a fresh process, self-calibrating: the backlog's extra collection time is held
against the extra time of holding the same number of calls the way they used to be queued (one
tracked tuple each), interleaved in the same process; the empty queue is measured before the
backlog and after it drained. The tests assert only the deterministic part (how many objects the
collector tracks, ``tests/test_gc_backlog.py``); the times are figures here, since another busy
process moves them by more than the margin a test could hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, Row

_PROBE = r"""
import gc, json, sys, time
from collections import deque
sys.path.insert(0, REPO)
from gym_artifacts.contract import registry
from gym_artifacts.live import live_run
from tests.backends import UnansweringLive

registry.register(UnansweringLive)

def full_collection_ms():
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1000

def tracked():
    gc.collect()
    return len(gc.get_objects())

def queued_the_old_way(n):
    # what a queued call used to be: a tuple holding the hooks (tracked), its arguments, a kind
    def hook(*args):
        pass
    return deque((hook, ({"loss": 0.5, "reward": 0.25, "tokens": 1234}, i, 1.0), "metrics", True, hook)
                 for i in range(n))

cfg = {"exporters": {"unanswering": {"enabled": True}}}
result = {}
with live_run(cfg, OUT) as live:
    worker = live.channels[0].worker
    worker.max_queued = BACKLOG + worker.MAX_BATCH
    live.flush(0.5)  # setup and config done; the metrics will wait behind an unanswering call
    empty_ms = [full_collection_ms() for _ in range(7)]
    result["tracked_empty"] = tracked()
    metrics = {"loss": 0.5, "reward": 0.25, "tokens": 1234}
    # the first batch taken (up to MAX_BATCH calls) is the one the backend never answers
    for step in range(BACKLOG + worker.MAX_BATCH):
        live.export_metrics(metrics, step=step)
    assert live.journal.flush(120), "the journal did not drain"
    result["pending"] = worker.pending
    result["tracked_backlog"] = tracked()
    backlog_ms, control_ms = [], []
    for _ in range(7):
        backlog_ms.append(full_collection_ms())
        old = queued_the_old_way(BACKLOG)
        control_ms.append(full_collection_ms())
        del old
    UnansweringLive.release.set()
    assert live.flush(120), "the backlog did not drain once the backend answered"
    empty_ms += [full_collection_ms() for _ in range(7)]  # before and after: drift hits both sides
    result.update(empty_ms=min(empty_ms), backlog_ms=min(backlog_ms), control_ms=min(control_ms))
print(json.dumps(result))
"""


def measure(out: Path, backlog: int) -> dict[str, Any]:
    """Run the probe in a fresh interpreter (bounded in time); its figures."""
    code = f"REPO = {str(REPO)!r}\nOUT = {str(out)!r}\nBACKLOG = {backlog}\n" + _PROBE
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=out.parent
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the gc probe failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(tiny: bool) -> list[Row]:
    backlog = 10_000 if tiny else 100_000
    with tempfile.TemporaryDirectory(prefix="gymart-bench-gc-") as tmp:
        r = measure(Path(tmp) / "eval.jsonl", backlog)
    excess = r["backlog_ms"] - r["empty_ms"]
    walk = r["control_ms"] - r["backlog_ms"]
    ratio = excess / walk if walk > 0 else None
    return [
        Row(
            f"gc: full collection with a {backlog:,}-call backlog",
            f"{excess:+.1f} ms over an empty queue ({r['empty_ms']:.1f} ms)",
            f"the same calls as tracked tuples: {walk:+.1f} ms",
            ratio,
            "<= 0.5x",
            None if ratio is None else ratio <= 0.5,
        )
    ]
