"""A backlog of live calls behind a dead backend costs the garbage collector nothing.

Each full collection of CPython's cyclic collector walks every tracked container alive, in
whichever thread crossed the allocation threshold, often the eval's own ``export_metrics``. What
decides its cost is how many objects it tracks: the queued calls must add (almost) none. That
count is deterministic, so it is what this test asserts, in a fresh process (bounded in time) so
pytest's own heap does not blur it. The collection times themselves are a benchmark
(``python -m benchmarks --only gc_backlog``): on a loaded machine they move by more than any
margin a test could hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gc_backlog import measure
from gym_artifacts.live.worker import BackgroundWorker

BACKLOG = 100_000
MAX_BATCH = BackgroundWorker.MAX_BATCH  # the one batch in flight may be tracked


@pytest.mark.slow
def test_a_dead_backends_backlog_adds_no_tracked_objects(tmp_path: Path) -> None:
    r = measure(tmp_path / "eval.jsonl", BACKLOG)
    assert r["pending"] >= BACKLOG, r  # the backlog really is queued behind the dead backend
    # What the collector may track is the one batch in flight (at most MAX_BATCH calls and their
    # one-by-one fallback), whatever the backlog; queued as containers, the backlog would add
    # 100,000 or more.
    assert r["tracked_backlog"] - r["tracked_empty"] < 3 * MAX_BATCH, r
