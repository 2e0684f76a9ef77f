"""RolloutSpool: live rollouts on disk, read back whole, memory flat however many arrive."""

from __future__ import annotations

import tracemalloc

from gym_artifacts.run.spool import RolloutSpool


def test_rollouts_round_trip_and_discard() -> None:
    spool = RolloutSpool()
    assert spool.finish() is None and list(spool.records()) == []
    spool.append([{"id": 1, "text": "é"}, {"id": 2}])
    spool.append([{"id": 3}])
    assert spool.rows == 3
    assert list(spool.records()) == [{"id": 1, "text": "é"}, {"id": 2}, {"id": 3}]
    path = spool.path
    assert path is not None and path.is_file()
    spool.discard()
    assert not path.exists() and not path.parent.exists() and spool.rows == 0


def test_memory_stays_flat_for_many_rollouts() -> None:
    spool = RolloutSpool()
    batch = [{"id": i, "response": "x" * 1000} for i in range(100)]
    tracemalloc.start()
    try:
        for _ in range(200):  # 20,000 rollouts, ~20 MB written
            spool.append(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert spool.rows == 20_000 and spool.path is not None and spool.path.stat().st_size > 20_000_000
    assert peak < 2_000_000, peak  # one batch's encoding, not the 20 MB
    assert sum(1 for _ in spool.records()) == 20_000
    spool.discard()
