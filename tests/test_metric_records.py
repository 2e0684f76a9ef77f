"""Queued metric records: exact round trip for plain values, untouched objects for the rest."""

from __future__ import annotations

import gc
import math
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gym_artifacts.run.metric_records import decode_record, encode_record

plain_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**200), max_value=2**200),  # marshal keeps big ints too
    st.booleans(),
    st.text(max_size=50),
    st.none(),
)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


@given(st.dictionaries(st.text(max_size=30), plain_values, max_size=40), st.one_of(st.none(), st.integers()))
def test_plain_metrics_round_trip_exactly_as_untracked_bytes(metrics: dict, step: int | None) -> None:
    record = encode_record(metrics, step, 1.5)
    assert type(record) is bytes and not gc.is_tracked(record)
    decoded, decoded_step, when = decode_record(record)
    assert decoded.keys() == metrics.keys()
    assert all(same(metrics[k], decoded[k]) for k in metrics)
    assert same(step, decoded_step) and when == 1.5


def test_numpy_values_and_steps_are_kept_as_objects_never_as_their_raw_bytes() -> None:
    # marshal would write any buffer-protocol object (numpy scalars, arrays) as bytes
    cases = [
        ({"loss": np.float32(0.5)}, 1),
        ({"count": np.int64(3)}, 1),
        ({"hist": np.array([1.0, 2.0])}, 1),
        ({"loss": 0.5}, np.int64(7)),
        ({"blob": memoryview(b"ab")}, 1),
        ({1: 0.5}, 1),  # a non-str key
        ({"nested": {"a": 1.0}}, 1),
    ]
    for metrics, step in cases:
        record = encode_record(metrics, step, 2.0)
        assert type(record) is tuple, metrics
        decoded, decoded_step, _ = decode_record(record)
        assert decoded.keys() == metrics.keys()
        assert all(decoded[k] is metrics[k] for k in metrics)  # the same objects, not bytes
        assert decoded_step is step


def test_a_record_is_a_snapshot_later_changes_to_the_callers_dict_do_not_leak_in() -> None:
    metrics = {"loss": 0.5}
    odd = {"loss": np.float64(0.5)}
    plain_record, odd_record = encode_record(metrics, 1, 1.0), encode_record(odd, 1, 1.0)
    metrics["loss"] = 9.0
    odd["extra"] = np.float64(1.0)
    assert decode_record(plain_record)[0] == {"loss": 0.5}
    assert decode_record(odd_record)[0].keys() == {"loss"}


def test_queued_records_keep_the_workers_priorities_order_and_loss_accounting() -> None:
    import threading

    from gym_artifacts.live.worker import BackgroundWorker, Call, RecordSink

    applied: list[Any] = []
    gate = threading.Event()
    sink = RecordSink(
        lambda m, s, t: applied.append([s]), lambda entries: applied.append([s for _, s, _ in entries])
    )
    worker = BackgroundWorker("t", max_queued=10, records=sink)
    worker.submit(Call(gate.wait, (5,), "block"))
    for step in range(50):  # past the bound: metric records are dropped first ...
        worker.submit_record(encode_record({"loss": 0.5}, step, 1.0))
    worker.submit(Call(applied.append, ("config",), "config"))  # ... never config or rollouts
    worker.submit_record(encode_record({"loss": np.float64(0.5)}, 99, 1.0))  # dropped too: still full
    gate.set()
    assert worker.stop(5)
    kept = applied[0]
    assert kept == sorted(kept) and len(kept) == 10 - 1  # the block call held one place in the queue
    assert applied[1:] == ["config"]
    assert worker.stats.dropped == worker.stats.dropped_kinds["metrics"] == 50 - 9 + 1
    assert worker.stats.delivered == 1 + 9 + 1
