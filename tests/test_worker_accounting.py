"""Every call handed to a worker is accounted for exactly once: delivered, failed, dropped or
undelivered, also when ``stop`` gives up while a batch is in the worker's hands."""

from __future__ import annotations

import threading
import time

import pytest

from gym_artifacts.live.worker import BackgroundWorker, RecordSink
from gym_artifacts.run.metric_records import encode_record


def accounted(worker: BackgroundWorker) -> int:
    s = worker.stats
    return s.delivered + s.failed + s.dropped + s.undelivered


def test_giving_up_counts_the_batch_in_flight_once_even_when_it_finishes_later() -> None:
    release = threading.Event()
    sink = RecordSink(lambda *a: release.wait(30), lambda entries: release.wait(30))
    worker = BackgroundWorker("t", max_queued=100_000, records=sink)
    calls = 5_000
    for step in range(calls):
        worker.submit_record(encode_record({"loss": 0.5}, step, 1.0))
    time.sleep(0.05)  # the worker takes its first batch and never hears back
    assert not worker.stop(0.3)
    assert worker.stats.undelivered == calls  # queued and in flight, at the moment of giving up
    release.set()  # the backend answers after all: the report already counted those calls
    worker._thread.join(10)
    assert accounted(worker) == calls


@pytest.mark.parametrize("stop_after", [0.0, 0.01, 0.03, 0.1])
def test_a_failing_backend_in_backoff_is_accounted_exactly_once(stop_after: float) -> None:
    def fail(*args: object) -> None:
        time.sleep(0.002)
        raise ConnectionError("down")

    worker = BackgroundWorker("t", max_queued=3_000, records=RecordSink(fail, fail), backoff_initial=0.05)
    submitted = 0
    started = time.monotonic()
    while time.monotonic() - started < stop_after + 0.05:
        worker.submit_record(encode_record({"loss": 0.5}, submitted, 1.0))
        submitted += 1
    worker.stop(0.02, hard_cap=0.05)
    accounted_at_stop = accounted(worker)
    worker._thread.join(10)
    assert accounted_at_stop == submitted
    assert accounted(worker) == submitted  # nothing counted twice afterwards


@pytest.mark.parametrize("poison", [0, 1, 4, 7])
def test_a_batch_that_reports_partial_progress_is_never_applied_twice(poison: int) -> None:
    from gym_artifacts.contract.hooks import PartialBatch

    stored: list[int] = []
    gate = threading.Event()

    def one(metrics: dict, step: int | None, when: float) -> None:
        gate.wait(10)
        if step == poison:
            raise ValueError("poison")
        stored.append(step)  # type: ignore[arg-type]

    def many(entries: list) -> None:  # the contract's default: one by one, saying how far it got
        for applied, entry in enumerate(entries):
            try:
                one(*entry)
            except Exception as exc:
                raise PartialBatch(applied, exc) from exc

    worker = BackgroundWorker("t", records=RecordSink(one, many))
    worker.submit_record(encode_record({"loss": 0.5}, 100, 1.0))  # held by the gate: the rest queue
    for step in range(8):
        worker.submit_record(encode_record({"loss": 0.5}, step, 1.0))
    gate.set()
    assert worker.stop(10)
    assert stored == [100, *[s for s in range(8) if s != poison]]
    assert (worker.stats.delivered, worker.stats.failed) == (8, 1)
    assert "poison" in (worker.stats.last_error or "")
