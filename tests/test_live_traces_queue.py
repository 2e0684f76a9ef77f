"""The live trace queue (``gym_artifacts.contract.live_traces``) on its own: a live run names each
rollout's trace as the export does whatever the completion order, and a platform that is down
never grows memory past the bound nor loses a rollout silently."""

from __future__ import annotations

import json
import socket
import tracemalloc
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts.contract.live_traces import LiveTraces, live_trace
from gym_artifacts.run.rollout_spans import failure_trace, rollout_trace
from tests.fixture_paths import NEMO_GYM_FIXTURES

RUN = NEMO_GYM_FIXTURES / "with-failures"
SCORED = [json.loads(line) for line in (RUN / "rollouts.jsonl").read_text().splitlines()]
FAILED = [json.loads(line) for line in (RUN / "rollouts_failures.jsonl").read_text().splitlines()]


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(st.permutations([("scored", i) for i in range(len(SCORED))] + [("failed", i) for i in range(len(FAILED))]))
def test_a_live_run_names_each_trace_as_the_export_whatever_the_completion_order(
    order: list[tuple[str, int]],
) -> None:
    """NeMo Gym hands rollouts over in completion order, failed ones among them; the files hold
    them apart (OUT.jsonl, OUT_failures.jsonl): the same trace id for each rollout either way."""
    scope = "mlflow/run-1"
    exported = {rollout_trace(scope, i, r, 0.0).trace_id for i, r in enumerate(SCORED)}
    exported |= {failure_trace(scope, i, r, None, 0.0).trace_id for i, r in enumerate(FAILED)}
    live: set[str] = set()
    scored = failed = 0
    for kind, i in order:
        record = SCORED[i] if kind == "scored" else FAILED[i]
        live.add(live_trace(scope, scored, failed, record, 0.0, frozenset()).trace_id)
        scored, failed = (scored + 1, failed) if kind == "scored" else (scored, failed + 1)
    assert live == exported and len(live) == len(SCORED) + len(FAILED)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


@pytest.mark.slow
def test_a_platform_down_keeps_memory_bounded_and_counts_every_rollout() -> None:
    """10,000 rollouts to a platform that refuses every connection: at most ``max_pending`` wait,
    the rest are counted left for the export, and memory does not grow with the rollouts."""
    url = f"http://127.0.0.1:{_closed_port()}/v1/traces"

    def send(traces: list[Any]) -> None:
        urllib.request.urlopen(url, data=b"{}", timeout=2)

    queue = LiveTraces(send, "mlflow/down", max_pending=500, backoff_initial=0.0, backoff_max=0.0)
    record = SCORED[0]
    tracemalloc.start()
    try:
        for i in range(10_000):
            queue.add([dict(record, _ng_task_index=i, _ng_rollout_index=0, pad="x" * 2000)])
            if i % 100 == 0:
                queue.send_pending()
            assert queue.pending <= 500
            if i == 1_000:
                early = tracemalloc.get_traced_memory()[0]
        late = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert late < early * 1.3 + 1_000_000  # 9,000 more rollouts, no more memory
    counts = queue.close()
    assert counts.sent == 0 and counts.left_for_export == 10_000
    assert counts.failed_attempts >= 100 and "Connection refused" in (counts.last_error or "")
    assert "10000 left for the export" in counts.describe()
