"""Finished rollouts on their way to a trace platform while the eval runs (a live backend's part).

A live backend that shows rollouts as traces (MLflow, Phoenix) keeps one ``LiveTraces``: its
``_log_rollouts`` hook (on the backend's worker thread, never the eval's) adds the rollouts and
sends what is pending, in batches over the platform's batch path (``send``). The traces are the
post-run export's (``rollout_spans``: spans, tokens, times, tools, failures, verdicts as
feedback), their ids derived from the live run's ``scope`` and each rollout's ``rollout_key``: the
export that completes the live run derives the same ids, finds what is there and sends only what
is missing.

A platform that fails or pushes back (HTTP 503, 429, a server down) is backed off (exponential,
capped) and its batch kept to be sent again. Memory is bounded: past ``max_pending`` rollouts
waiting, the oldest are left to the export (the run's files hold every rollout) and counted, never
dropped silently; at teardown what could not be sent is left to the export likewise. The counts
(``TraceCounts``) end up in the teardown report.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gym_artifacts.core.secrets import redact_text
from gym_artifacts.run.rollout_spans import RolloutTrace, failure_trace, rollout_trace
from gym_artifacts.run.trajectory import is_failure_record

MAX_PENDING = 2_000  # rollouts waiting for a platform that is down; past it the export sends them
BATCH = 50  # traces a request at most, unless the backend names its platform's batch (most take more)
# Seconds of sending a hook call spends at most: the worker gets back to the calls queued behind it
# (their rollouts join the pending ones; past the bound the export sends them), so its queue, and
# memory, stay bounded whatever the rate of rollouts.
SEND_BUDGET_S = 0.25
# At teardown: what is waiting gets this long to be sent (the rest is the export's), within the
# teardown's own deadlines (each batch that lands restarts its idle wait: ``on_sent``).
CLOSE_BUDGET_S = 10.0


@dataclass
class TraceCounts:
    """What one platform took of a live run's rollouts as traces."""

    sent: int = 0  # traces the platform accepted
    left_for_export: int = 0  # not sent live (platform down, bound passed, teardown): the export sends them
    failed_attempts: int = 0  # requests that failed or were pushed back, each backed off
    last_error: str | None = None

    def describe(self) -> str:
        text = f"{self.sent} traces"
        if self.left_for_export:
            text += f" ({self.left_for_export} left for the export"
            text += f"; last error: {self.last_error})" if self.last_error else ")"
        return text


def live_trace(scope: str, scored: int, failed: int, record: Any, fallback_s: float,
               secrets: frozenset[str]) -> RolloutTrace:  # fmt: skip
    """The trace of one rollout handed to a live run: a failed one (NeMo Gym's failure record,
    routed to the sidecar) as the export's ERROR trace of the sidecar row, else a scored one;
    ``scored`` / ``failed``: its place among the live run's scored / failed rollouts (the key of a
    record without NeMo Gym's indices)."""
    if is_failure_record(record):
        return failure_trace(scope, failed, record, None, fallback_s, secrets)
    return rollout_trace(scope, scored, record, fallback_s, secrets)


class LiveTraces:
    """Rollouts waiting to become traces on one platform; used on the backend's worker thread only.

    ``send(traces)`` delivers one batch (raises when the platform failed it or pushed back).
    """

    def __init__(
        self,
        send: Callable[[list[RolloutTrace]], None],
        scope: str,
        secrets: frozenset[str] = frozenset(),
        *,
        on_sent: Callable[[], None] | None = None,
        batch: int = BATCH,
        max_pending: int = MAX_PENDING,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
    ) -> None:
        self._send = send
        self._on_sent = on_sent
        self.scope = scope
        self._secrets = secrets
        self._batch = batch
        self._max_pending = max_pending
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._pending: deque[tuple[Any, int, int, float]] = deque()  # record, places, arrival
        self._scored = 0
        self._failed = 0
        self._failures_in_row = 0
        self._retry_at = 0.0
        self._counts = TraceCounts()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def due(self) -> bool:
        """Rollouts wait and the platform is not being backed off: worth another turn."""
        return bool(self._pending) and time.monotonic() >= self._retry_at

    @property
    def counts(self) -> TraceCounts:
        """What the platform took so far; every rollout still waiting counts as left for the
        export (read once the worker stopped, that is what it is)."""
        c = self._counts
        return TraceCounts(c.sent, c.left_for_export + len(self._pending), c.failed_attempts, c.last_error)

    def add(self, rollouts: list[Any]) -> None:
        """Queue finished rollouts (their place in the run taken now); past the bound the oldest
        waiting ones are left to the export, counted."""
        now = time.time()  # a rollout without a time of its own just finished
        for record in rollouts:
            self._pending.append((record, self._scored, self._failed, now))
            if is_failure_record(record):
                self._failed += 1
            else:
                self._scored += 1
        excess = len(self._pending) - self._max_pending
        for _ in range(max(0, excess)):
            self._pending.popleft()
            self._counts.left_for_export += 1

    def send_pending(self, *, force: bool = False, budget_s: float | None = SEND_BUDGET_S) -> None:
        """Send what is waiting, a batch at a time, for up to ``budget_s`` seconds (None: until
        all is sent), unless the platform is being backed off (``force``: try once anyway); a
        failed batch stays, to be sent again after the backoff."""
        started = time.monotonic()
        if not force and started < self._retry_at:
            return
        while self._pending and (budget_s is None or time.monotonic() - started < budget_s):
            chunk = [self._pending[i] for i in range(min(self._batch, len(self._pending)))]
            traces = [live_trace(self.scope, s, f, r, t, self._secrets) for r, s, f, t in chunk]
            try:
                self._send(traces)
            except Exception as exc:
                self._failed_once(exc)
                return
            for _ in chunk:
                self._pending.popleft()
            self._counts.sent += len(chunk)
            self._failures_in_row = 0
            self._retry_at = 0.0
            if self._on_sent is not None:
                self._on_sent()

    def _failed_once(self, exc: Exception) -> None:
        self._counts.failed_attempts += 1
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        self._counts.last_error = redact_text(text, self._secrets)
        self._failures_in_row += 1
        delay = min(self._backoff_max, self._backoff_initial * 2 ** (self._failures_in_row - 1))
        self._retry_at = time.monotonic() + delay

    def close(self, budget_s: float = CLOSE_BUDGET_S) -> TraceCounts:
        """At teardown: what is waiting is sent for up to ``budget_s`` seconds (one try even if
        the platform is being backed off), the rest left to the export."""
        self.send_pending(force=True, budget_s=budget_s)
        self._counts.left_for_export += len(self._pending)
        self._pending.clear()
        return self.counts
