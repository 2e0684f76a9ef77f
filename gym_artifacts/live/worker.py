"""A per-exporter background worker: callers only enqueue; one thread applies calls in order.

The caller's path is a ``deque.append`` and, when the worker sleeps, an event set: no I/O, no
SDK call, and no lock that the worker holds while it talks to a backend. Metric calls are queued
as records (see :mod:`gym_artifacts.run.metric_records`): objects the garbage collector never walks,
so a backlog behind a dead backend does not lengthen the collections the eval's thread pays for.
The queue is bounded for droppable items (step metrics): past the bound a new one is dropped and
counted, while config, rollouts and lifecycle requests are always kept. A failing backend is backed off
(exponential, capped) and its failures are logged once per burst. ``stop`` drains within a
deadline and then gives up, saying what was not delivered: the deadline is an *idle* one (it
restarts whenever a call is delivered, and a setup call still running counts as progress, so a
slow first setup, such as a fresh SQLite store creating its schema, is waited for) under a hard cap.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from gym_artifacts.contract.hooks import PartialBatch
from gym_artifacts.run.metric_records import MetricEntry, MetricRecord, decode_record, is_record

logger = logging.getLogger(__name__)

# Calls whose running counts as progress at teardown: opening a run may create a store first.
SLOW_KINDS = frozenset({"setup"})


@dataclass
class WorkerStats:
    """What happened to the calls handed to one worker."""

    delivered: int = 0
    failed: int = 0  # calls lost to backend errors
    failed_attempts: int = 0  # backend calls that raised (a batch is one attempt)
    dropped: int = 0
    dropped_full: int = 0  # of ``dropped``: the queue was at its bound (the rest came after the stop)
    undelivered: int = 0
    last_error: str | None = None
    dropped_kinds: dict[str, int] = field(default_factory=dict)

    def loss_causes(self, max_queued: int, timeout: float) -> str:
        """Each kind of loss with its count and cause (``timeout``: the stop's idle deadline)."""
        causes = []
        if self.dropped_full:
            causes.append(f"{self.dropped_full} dropped with its queue full ({max_queued:,} waiting: "
                          "written slower than they came)")  # fmt: skip
        if self.dropped > self.dropped_full:
            causes.append(f"{self.dropped - self.dropped_full} handed to it after it had stopped")
        if self.undelivered:
            causes.append(f"{self.undelivered} not written before the {timeout:g} s deadline "
                          "(the write in progress did not return)")  # fmt: skip
        if self.failed:
            causes.append(f"{self.failed} failed to write (last: {self.last_error})")
        return "; ".join(causes) or f"it did not stop within {timeout:g} s"


class Call(NamedTuple):
    """One request for the worker: ``fn(*args)``, droppable or not, with a kind for reports.

    A tuple, not a dataclass: building one is on the caller's path, so it must be cheap.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kind: str
    droppable: bool = False
    # Consecutive calls with the same ``batch`` function are applied as one ``batch(list of args)``.
    batch: Callable[[list[tuple[Any, ...]]], Any] | None = None
    # False for a worker's own housekeeping (open, close a file): not a caller's call, so never
    # counted delivered, failed or undelivered (its failure is still an attempt and an error).
    counted: bool = True


class RecordSink(NamedTuple):
    """How a worker applies queued metric records: one alone, or a run of them at once."""

    one: Callable[[dict[str, Any], int | None, float], Any]
    many: Callable[[list[MetricEntry]], Any]
    kind: str = "metrics"


class _Marker:
    """A request answered by setting an event once every earlier call was applied."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _Stop(_Marker):
    __slots__ = ()


def _counted(item: object) -> bool:
    """Whether a queue item is a caller's call (counted in the stats) rather than a marker or
    the worker's own housekeeping."""
    return not isinstance(item, _Marker) and (type(item) is not Call or item.counted)  # type: ignore[union-attr]


_live_workers: weakref.WeakSet[BackgroundWorker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for worker in list(_live_workers):
        worker._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class BackgroundWorker:
    """Applies calls on a daemon thread, in the order they were submitted."""

    LINGER = 0.05
    POLL = 0.002
    MAX_BATCH = 1000
    # Calls of a kind whose batch hook takes any number at once (rollouts: spooled, traces
    # bounded by the backend): every one queued goes in one batch, so a slow batch (a platform
    # taking traces) never lets the queue, and the memory it holds, grow with the rate of calls.
    GROUP_LIMITS: ClassVar[dict[str, int]] = {"rollouts": 1_000_000}
    # When ``stop`` gives up while a call is inside the backend, it waits this long for that
    # call to return, so that a batch about to land (a journal write) is not reported lost.
    GIVE_UP_GRACE = 0.25
    FALLBACK_PROBES = 3

    def __init__(
        self,
        name: str,
        *,
        max_queued: int = 10_000,
        backoff_initial: float = 0.25,
        backoff_max: float = 30.0,
        redact: Callable[[str], str] = str,
        records: RecordSink | None = None,
    ) -> None:
        self.name = name
        self.records = records
        self.redact = redact
        self.stats = WorkerStats()
        self.max_queued = max_queued
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._queue: deque[Call | _Marker | MetricRecord] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._idle = False
        self._deadline: float | None = None  # the hard cap, once stopping
        self._idle_timeout = 0.0
        self._progress_at = 0.0
        self._in_call: str | None = None  # the kind of the call being applied
        self._burst = 0
        self._backoff_until = 0.0
        self._pid = os.getpid()
        self._accepting = True  # a plain flag: cheaper on the caller's path than Event.is_set()
        self._last_busy = 0.0
        # Accounting: the calls the worker took from the queue and has not settled yet, and
        # whether ``stop`` gave up (then it counted them, and the worker counts nothing more).
        self._accounting = threading.Lock()  # worker and ``stop`` only, never the caller's path
        self._in_flight = 0
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name=f"gym-artifacts-{name}", daemon=True)
        self._thread.start()
        _live_workers.add(self)

    # -- caller side: enqueue only ------------------------------------------------------------
    def submit(self, call: Call) -> bool:
        """Hand a call to the worker; False when it was dropped (queue full, stopped, forked)."""
        if not self._accepting:
            self._count_drop(call.kind)
            return False
        if call.droppable and len(self._queue) >= self.max_queued:
            self._count_drop(call.kind, full=True)
            return False
        self._queue.append(call)
        if self._idle:
            self._wake.set()
        return True

    def submit_record(self, record: MetricRecord) -> bool:
        """Hand a metric record to the worker (droppable); False when it was dropped."""
        if not self._accepting or len(self._queue) >= self.max_queued or self.records is None:
            full = self._accepting and self.records is not None
            self._count_drop("metrics" if self.records is None else self.records.kind, full=full)
            return False
        self._queue.append(record)
        if self._idle:
            self._wake.set()
        return True

    def _count_drop(self, kind: str, full: bool = False) -> None:
        self.stats.dropped += 1
        self.stats.dropped_full += full
        self.stats.dropped_kinds[kind] = self.stats.dropped_kinds.get(kind, 0) + 1

    def flush(self, timeout: float) -> bool:
        """Wait until every call submitted before this one was applied (or ``timeout``)."""
        if self._pid != os.getpid():
            return False
        if not self._accepting:  # stopping: its drain is the flush
            self._thread.join(timeout)
            return not self._thread.is_alive()
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout)

    def stop(self, timeout: float, hard_cap: float | None = None) -> bool:
        """Apply what is queued, then stop; True when all was applied.

        Waits while the backend makes progress: it gives up once ``timeout`` seconds pass with
        no call delivered (a setup call still running counts as progress), and in any case after
        ``hard_cap`` seconds (default: ``timeout``).
        """
        if self._pid != os.getpid():
            return False
        given_up_before = self.stats.undelivered
        now = time.monotonic()
        timeout = max(0.0, timeout)
        cap = now + max(timeout, hard_cap if hard_cap is not None else timeout)
        self._idle_timeout = timeout
        self._progress_at = now
        self._deadline = cap
        marker = _Stop()
        self._queue.append(marker)
        self._accepting = False
        self._stopping.set()
        self._wake.set()
        finished = False
        while not finished:
            now = time.monotonic()
            if self._in_call in SLOW_KINDS:
                self._progress_at = now  # a setup still running is progress, not a hang
            if now >= self._current_deadline():
                finished = marker.done.is_set()
                break
            finished = marker.done.wait(min(0.1, self._current_deadline() - now))
        if not finished:
            grace_end = time.monotonic() + self.GIVE_UP_GRACE
            while True:
                # A call being applied gets the grace to finish. The worker marks a call applied
                # under this lock, so once nothing is being applied, nothing starts after the
                # count below: every call is counted once (delivered by the worker, or here).
                with self._accounting:
                    if self._in_call is None or time.monotonic() >= grace_end:
                        queued = sum(1 for item in list(self._queue) if _counted(item))
                        self.stats.undelivered += queued + self._in_flight
                        self._in_flight = 0
                        self._abandoned = True
                        break
                time.sleep(0.005)
        # the marker is reached also when the worker gave the rest up at the deadline
        return finished and self.stats.undelivered == given_up_before

    def submit_own(self, call: Call) -> bool:
        """A follow-up of the worker's own (``counted=False``), from its thread: queued while the
        worker accepts calls, else ignored; never counted as a caller's call nor as dropped (one
        queued as ``stop`` begins lands after its stop marker, never applied)."""
        if not self._accepting or call.counted:
            return False
        self._queue.append(call)
        return True

    def progress(self) -> None:
        """The call being applied made progress (a long call: a batch of it landed): a stopping
        worker's idle deadline restarts from now (the hard cap still holds)."""
        self._progress_at = time.monotonic()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _forget_after_fork(self) -> None:
        """In a forked child the thread is gone: drop further calls rather than hang."""
        self._accepting = False
        self._queue = deque()
        self._accounting = threading.Lock()  # the worker may have held it at the fork
        self._wake = threading.Event()
        self._stopping = threading.Event()

    # -- worker side ----------------------------------------------------------------------------
    def _take(self) -> Call | _Marker | MetricRecord:
        """The next queue item, counted in flight (under the lock ``stop`` counts with)."""
        with self._accounting:
            item = self._queue.popleft()
            if _counted(item):
                self._in_flight += 1
            return item

    def _settle(self, delivered: int = 0, failed: int = 0, undelivered: int = 0) -> None:
        """Count the fate of calls in flight, unless ``stop`` gave up and counted them already."""
        with self._accounting:
            if self._abandoned:
                return
            self.stats.delivered += delivered
            self.stats.failed += failed
            self.stats.undelivered += undelivered
            self._in_flight -= delivered + failed + undelivered

    def _run(self) -> None:
        while True:
            try:
                item = self._take()
            except IndexError:
                # Right after work, poll briefly instead of sleeping on the event: a caller that
                # logs again soon then pays no wake-up (Event.set takes a lock).
                if time.monotonic() - self._last_busy < self.LINGER:
                    time.sleep(self.POLL)
                    continue
                self._idle = True
                if self._queue:
                    self._idle = False
                    continue
                self._wake.wait(0.5)
                self._wake.clear()
                self._idle = False
                continue
            self._last_busy = time.monotonic()
            if isinstance(item, _Stop):
                item.done.set()
                return
            if isinstance(item, _Marker):
                item.done.set()
                continue
            if is_record(item):
                self._apply_records(item)  # type: ignore[arg-type]
                continue
            assert isinstance(item, Call)
            if item.batch is not None:
                group = [item]
                queue = self._queue
                limit = self.GROUP_LIMITS.get(item.kind, self.MAX_BATCH)
                while queue and len(group) < limit:
                    following = queue[0]
                    if not isinstance(following, Call) or following.batch is not item.batch:
                        break
                    group.append(self._take())  # type: ignore[arg-type]
                # a lone call goes through its own function; only a run of them through ``batch``
                self._apply(item, group if len(group) > 1 else None)
            else:
                self._apply(item)

    def _apply_records(self, first: MetricRecord) -> None:
        """Apply ``first`` and the records queued right behind it (up to MAX_BATCH) at once."""
        sink = self.records
        assert sink is not None
        entries = [decode_record(first)]
        queue = self._queue
        while queue and len(entries) < self.MAX_BATCH and is_record(queue[0]):
            entries.append(decode_record(self._take()))  # type: ignore[arg-type]
        if len(entries) == 1:
            self._deliver(sink.kind, True, 1, sink.one, *entries[0])
        else:
            singles = [(sink.one, entry) for entry in entries]
            self._deliver(sink.kind, True, len(entries), sink.many, entries, singles=singles)

    def _current_deadline(self) -> float:
        """When a stopping worker gives up: idle time since the last progress, within the cap;
        at once when the backend is down (``FALLBACK_PROBES`` calls failed in a row, none
        delivered since): a server that refuses every call is not tried until the idle deadline
        while the eval waits to exit (the journal keeps every call for the export)."""
        assert self._deadline is not None
        if self._burst >= self.FALLBACK_PROBES:
            return min(self._deadline, self._progress_at)
        return min(self._deadline, self._progress_at + self._idle_timeout)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._current_deadline()

    def _apply(self, call: Call, group: list[Call] | None = None) -> None:
        if group is None:
            self._deliver(call.kind, call.droppable, 1 if call.counted else 0, call.fn, *call.args)
        else:
            assert call.batch is not None
            args = [c.args for c in group]
            singles = [(c.fn, c.args) for c in group]
            self._deliver(call.kind, call.droppable, len(group), call.batch, args, singles=singles)

    def _deliver(
        self,
        kind: str,
        droppable: bool,
        count: int,
        fn: Callable[..., Any],
        *args: Any,
        singles: list[tuple[Callable[..., Any], tuple[Any, ...]]] | None = None,
    ) -> None:
        """``fn(*args)`` standing for ``count`` calls: after any backoff, before the deadline.

        ``singles`` are those calls one by one: applied when the batch fails (see
        :meth:`_apply_one_by_one`).
        """
        if droppable and self._past_deadline():
            self._settle(undelivered=count)
            return
        wait = self._backoff_until - time.monotonic()
        if wait > 0:
            if self._deadline is not None:
                wait = min(wait, max(0.0, self._current_deadline() - time.monotonic()))
            if self._deadline is None:
                self._stopping.wait(wait)  # a stop request ends the pause early
            else:
                time.sleep(wait)
            if droppable and self._past_deadline():
                self._settle(undelivered=count)
                return
        with self._accounting:
            if droppable and self._abandoned:
                return  # ``stop`` gave up and counted these calls: not applied after the report
            self._in_call = kind
        try:
            fn(*args)
        except Exception as exc:
            self._in_call = None
            if singles is None:
                self._on_failure(kind, exc, count)
            elif isinstance(exc, PartialBatch):
                self._apply_one_by_one(kind, droppable, singles, exc.error, applied=exc.applied)
            else:
                self._apply_one_by_one(kind, droppable, singles, exc)
        else:
            self._settle(delivered=count)
            self._progress_at = time.monotonic()
            self._in_call = None
            self._on_success()

    def _on_success(self) -> None:
        if self._burst:
            logger.warning("%s: backend recovered after %d failed call(s)", self.name, self._burst)
            self._burst = 0
            self._backoff_until = 0.0

    def _apply_one_by_one(
        self,
        kind: str,
        droppable: bool,
        singles: list[tuple[Callable[..., Any], tuple[Any, ...]]],
        batch_error: Exception,
        applied: int | None = None,
    ) -> None:
        """A batch failed: apply its calls alone, so that one poison value loses only its call.

        ``applied``: the batch got that far (see :class:`PartialBatch`): its first ``applied``
        calls were delivered and the next one failed; only the calls after it are applied here.
        When the first ``FALLBACK_PROBES`` calls fail alone too, the backend itself is failing:
        the rest are counted failed without trying each (a dead server is not asked 1000 times).
        """
        succeeded = failed = start = 0
        if applied is not None:
            succeeded, failed, start = applied, 1, applied + 1
        error = batch_error
        for i in range(start, len(singles)):
            fn, args = singles[i]
            if not succeeded and failed >= self.FALLBACK_PROBES:
                failed += len(singles) - i
                break
            with self._accounting:
                if droppable and self._abandoned:
                    return  # ``stop`` gave up and counted these calls
                self._in_call = kind
            try:
                fn(*args)
            except Exception as exc:
                failed += 1
                error = exc
            else:
                succeeded += 1
                self._progress_at = time.monotonic()
            finally:
                self._in_call = None
        if not succeeded:
            self._on_failure(kind, error, failed)
            return
        self._settle(delivered=succeeded, failed=failed)
        if failed:  # the backend works; only these calls' values were refused
            self.stats.failed_attempts += failed
            self.stats.last_error = self.redact(f"{type(error).__name__}: {error}".splitlines()[0][:500])
            logger.warning(
                "%s: %d %s call(s) refused by the backend (%s); the other %d applied",
                self.name, failed, kind, self.stats.last_error, succeeded,
            )  # fmt: skip
        self._on_success()

    def _on_failure(self, kind: str, exc: Exception, count: int = 1) -> None:
        self._settle(failed=count)
        self.stats.failed_attempts += 1
        self.stats.last_error = self.redact(f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
        self._burst += 1
        if self._burst == 1:
            logger.warning(
                "%s: %s failed (%s); backing off, further failures counted, not logged",
                self.name, kind, self.stats.last_error,
            )  # fmt: skip
        delay = min(self.backoff_max, self.backoff_initial * (2 ** (self._burst - 1)))
        self._backoff_until = time.monotonic() + delay
