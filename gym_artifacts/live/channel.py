"""LiveChannel: one live backend behind a queue (OpenTelemetry's batch processor role).

The channel is the only thing that calls a live backend's hooks (``contract.hooks.LiveHooks``), and
only from its own worker thread: the caller's methods enqueue and return, never raise and never
wait on the backend. Lifecycle requests (setup, start over, complete, teardown) travel through
the same queue as the data, so the backend's run is touched by one thread in call order. The
channel owns what a backend should not have to know: the guards that skip calls once setup
failed, the run-id marker beside the run (written at setup, completed by ``complete``, its
delivery recorded at teardown: the facts the post-run export certifies by), and the accounting
that becomes the ``LiveReport``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym_artifacts.contract.hooks import RunStatus
from gym_artifacts.contract.live_exporter import LiveTracing
from gym_artifacts.contract.live_traces import LiveTraces, TraceCounts
from gym_artifacts.core.errors import ReceiptError
from gym_artifacts.core.secrets import mask_secrets, redact_text
from gym_artifacts.live.worker import BackgroundWorker, Call, RecordSink, WorkerStats
from gym_artifacts.run.metric_records import MetricRecord, encode_record
from gym_artifacts.run.receipts import RunIdMarker, read_marker, utc_now_iso, write_marker

if TYPE_CHECKING:
    from gym_artifacts.contract.live_exporter import LiveExporter
    from gym_artifacts.run.artifacts import RunArtifacts

logger = logging.getLogger(__name__)

DEFAULT_TEARDOWN_TIMEOUT_S = 10.0  # idle: teardown gives up after this long without progress
DEFAULT_TEARDOWN_HARD_CAP = 60.0  # and in any case after this long
TEARDOWN_TIMEOUT_ENV = "GYM_ARTIFACTS_TEARDOWN_IDLE_S"
TEARDOWN_HARD_CAP_ENV = "GYM_ARTIFACTS_TEARDOWN_MAX_S"


def teardown_limits(idle: float | None = None, hard_cap: float | None = None) -> tuple[float, float]:
    """(idle deadline, hard cap) in seconds: the arguments, else the environment, else the defaults."""

    def pick(value: float | None, env: str, default: float) -> float:
        if value is not None:
            return float(value)
        raw = os.environ.get(env)
        try:
            return float(raw) if raw else default
        except ValueError:
            logger.warning("%s=%r is not a number of seconds; using %s", env, raw, default)
            return default

    return pick(idle, TEARDOWN_TIMEOUT_ENV, DEFAULT_TEARDOWN_TIMEOUT_S), pick(
        hard_cap, TEARDOWN_HARD_CAP_ENV, DEFAULT_TEARDOWN_HARD_CAP
    )


@dataclass
class LiveReport:
    """What one backend received live, and what it did not."""

    exporter: str
    run_id: str | None
    setup_error: str | None
    delivered: int
    failed: int
    dropped: int
    undelivered: int
    teardown_finished: bool
    last_error: str | None = None
    dropped_kinds: dict[str, int] = field(default_factory=dict)
    traces: TraceCounts | None = None  # the rollouts the platform took as traces (None: sends none live)

    @property
    def lost(self) -> int:
        """Calls that never reached the backend (failed, dropped or left undelivered)."""
        return self.failed + self.dropped + self.undelivered

    def describe(self) -> str:
        if self.setup_error:
            return f"{self.exporter}: setup failed ({self.setup_error}); nothing was sent live"
        parts = [f"{self.exporter}: {self.delivered} call(s) delivered"]
        if self.failed:
            parts.append(f"{self.failed} failed (last: {self.last_error})")
        if self.dropped:
            parts.append(f"{self.dropped} dropped ({self.dropped_kinds})")
        if self.undelivered:
            parts.append(f"{self.undelivered} not delivered before the deadline")
        if not self.teardown_finished:
            parts.append("teardown did not finish in time")
        if self.traces is not None:
            parts.append(self.traces.describe())
        return ", ".join(parts)


def summary_line(reports: Sequence[LiveReport]) -> str:
    """One line for all backends: ``local 12 delivered, 0 failed, 0 undelivered; ...``."""
    if not reports:
        return "no live backend"
    parts = []
    for r in reports:
        if r.setup_error:
            parts.append(f"{r.exporter} setup failed")
            continue
        counts = f"{r.delivered} delivered, {r.failed} failed, {r.undelivered} undelivered"
        if r.dropped:
            counts += f", {r.dropped} dropped"
        if r.traces is not None:
            counts += f", {r.traces.describe()}"
        parts.append(f"{r.exporter} {counts}")
    return "; ".join(parts)


class LiveChannel:
    """One live backend, its worker, its marker and its report.

    Call-site methods (``export_*``, ``start_over``, ``complete``, ``flush``, ``teardown``)
    only enqueue or wait with a deadline; everything that touches the backend or its marker
    runs on the worker thread (``_do_*``), except the delivery record that teardown writes after
    the worker stopped or was given up on.
    """

    def __init__(self, backend: LiveExporter, *, after_setup: Callable[[], None] | None = None) -> None:
        self.backend = backend
        self.name = backend.name
        self.worker: BackgroundWorker | None = None
        self._after_setup = after_setup
        self._setup_error: str | None = None
        self._torn_down = False
        # The marker is rewritten by the worker (complete) and by teardown (delivery record);
        # once teardown recorded the delivery, a late complete() from the worker never lands.
        self._marker_lock = threading.Lock()
        self._delivery_recorded = False
        self._skipped = 0
        self._report: LiveReport | None = None
        # Set by setup() on the caller's thread and read there (masking a config as it is logged);
        # the backend gets its copy on the worker thread, with the rest of its context.
        self._secrets: frozenset[str] = frozenset()
        self._previous_last_step: Callable[[], int | None] | None = None
        # One function object for every rollouts call: the worker groups consecutive calls that
        # share it into one ``_log_rollouts_batch`` (calls queued behind a slow platform).
        self._rollouts_batch = self._then_traces(
            self._guarded_batch(lambda calls: backend._log_rollouts_batch([args[0] for args in calls]))
        )
        self._traces_turn_queued = False

    # -- call site: enqueue only, never raise, never block on the backend --------------------------
    def setup(
        self,
        run: RunArtifacts,
        *,
        resume: bool = False,
        secrets: frozenset[str] = frozenset(),
        previous_last_step: Callable[[], int | None] | None = None,
    ) -> None:
        """Start the worker and ask it to open (or, with ``resume``, reopen) the backend run.

        ``previous_last_step`` tells a resumed backend the last step an earlier process logged.
        """
        backend = self.backend
        self._secrets = frozenset(secrets)
        self._previous_last_step = previous_last_step
        records = RecordSink(
            self._guarded(backend._log_metrics), self._guarded_batch(backend._log_metrics_batch)
        )
        self.worker = BackgroundWorker(self.name, redact=backend.redact, records=records)
        self.worker.submit(Call(self._do_setup, (run, resume), "setup"))

    def export_config(self, config: Mapping[str, Any]) -> None:
        """Log the config (masked again here: a caller may pass an unmasked one)."""
        try:
            masked = mask_secrets(dict(config), self._secrets)
        except Exception as exc:
            logger.warning("%s: config not logged: %s", self.name, redact_text(str(exc), self._secrets))
            return
        self._submit(Call(self._guarded(self.backend._log_config), (masked,), "config"))

    def export_metrics(
        self, metrics: Mapping[str, Any], step: int | None = None, *, timestamp: float | None = None
    ) -> None:
        """Log step metrics (dropped first when the queue is full)."""
        when = time.time() if timestamp is None else timestamp
        self.export_record(encode_record(metrics, step, when))

    def export_record(self, record: MetricRecord) -> None:
        """The fan-out's fast path: one record, encoded once, shared by every channel."""
        worker = self.worker
        if worker is not None:
            worker.submit_record(record)

    def export_rollouts(self, rollouts: list[Any]) -> None:
        """Log finished rollouts (never dropped)."""
        hook = self._then_traces(self._guarded(self.backend._log_rollouts))
        self._submit(Call(hook, (list(rollouts),), "rollouts", batch=self._rollouts_batch))

    def start_over(self) -> None:
        """Resume found nothing to resume: close the reopened run and open a new one."""
        self._submit(Call(self._do_start_over, (), "start_over"))

    def complete(self, identities: Callable[[], Mapping[str, str] | None] | None = None) -> None:
        """Record that the eval finished, so ``export --certify`` may complete this live run."""
        self._submit(Call(self._do_complete, (identities,), "complete"))

    def flush(self, timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S) -> bool:
        """Wait (up to ``timeout``) until every earlier call was applied."""
        return self.worker.flush(timeout) if self.worker is not None else True

    def teardown(
        self,
        timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S,
        status: RunStatus = RunStatus.FINISHED,
        hard_cap: float | None = None,
    ) -> LiveReport:
        """Flush while the backend makes progress (``timeout`` idle, ``hard_cap`` at most), end the
        backend run, and report what was not delivered."""
        if self._report is not None:
            return self._report
        worker = self.worker
        if worker is None:
            self._report = LiveReport(self.name, None, "setup never ran", 0, 0, 0, 0, True)
            return self._report
        worker.submit(Call(self._do_teardown, (status,), "teardown"))
        self._report = self.report(finished=worker.stop(timeout, hard_cap))
        self._record_delivery(self._report)
        return self._report

    def report(self, *, finished: bool) -> LiveReport:
        """What this backend received so far (calls still queued count as undelivered)."""
        worker = self.worker
        if worker is None:
            return LiveReport(self.name, None, "setup never ran", 0, 0, 0, 0, finished)
        stats = worker.stats
        queued = 0 if finished else worker.pending
        return LiveReport(
            exporter=self.name,
            run_id=self.backend.run_id,
            setup_error=self._setup_error,
            delivered=stats.delivered - self._skipped,
            failed=stats.failed,
            dropped=stats.dropped,
            undelivered=max(stats.undelivered, queued) + self._skipped,
            teardown_finished=finished,
            last_error=stats.last_error,
            dropped_kinds=dict(stats.dropped_kinds),
            traces=self.backend.live_trace_counts() if isinstance(self.backend, LiveTracing) else None,
        )

    @property
    def setup_failed(self) -> bool:
        """Whether the backend's setup ran and failed (its calls are then skipped)."""
        return self._setup_error is not None

    @property
    def stats(self) -> WorkerStats | None:
        return self.worker.stats if self.worker is not None else None

    def _submit(self, call: Call) -> None:
        if self.worker is not None:
            self.worker.submit(call)

    # -- guards: a hook is skipped (counted undelivered, not failed) once setup failed ----------------
    def _open(self) -> bool:
        return self._setup_error is None and self.backend.run_id is not None

    def _guarded(self, hook: Callable[..., None]) -> Callable[..., None]:
        def apply(*args: Any) -> None:
            if not self._open():
                self._skipped += 1  # counted as undelivered, without backing off
                return
            hook(*args)

        return apply

    def _guarded_batch(self, hook: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        def apply(entries: list[Any]) -> None:
            if not self._open():
                self._skipped += len(entries)
                return
            hook(entries)

        return apply

    # -- live traces: what a rollouts call left waiting gets another turn (worker thread) ---------------
    def _then_traces(self, hook: Callable[..., None]) -> Callable[..., None]:
        def apply(*args: Any) -> None:
            try:
                hook(*args)
            finally:
                self._queue_traces_turn()

        return apply

    def _live_traces(self) -> LiveTraces | None:
        """The backend's live trace queue (``LiveTracing``), if it keeps one."""
        return self.backend.live_traces if isinstance(self.backend, LiveTracing) else None

    def _queue_traces_turn(self) -> None:
        """Traces still waiting (a hook call sends for a bounded time) and a platform not backed
        off: one more turn once the calls queued now are applied, so the last rollouts of an eval
        reach the platform while it runs, not at teardown. A platform being backed off gets its
        next try with the next rollouts call, or at teardown (never a busy loop)."""
        traces, worker = self._live_traces(), self.worker
        if traces is None or worker is None or self._traces_turn_queued or not traces.due:
            return
        if self._open():
            self._traces_turn_queued = worker.submit_own(Call(self._traces_turn, (), "traces", counted=False))

    def _traces_turn(self) -> None:
        self._traces_turn_queued = False
        traces = self._live_traces()
        if traces is not None:
            traces.send_pending()
        self._queue_traces_turn()

    # -- lifecycle on the worker thread ------------------------------------------------------------
    def _do_setup(self, run: RunArtifacts, resume: bool) -> None:
        backend = self.backend
        marker_fpath = run.run_id_marker_fpath(self.name)
        resume_run_id = None
        if resume:
            try:
                marker = read_marker(marker_fpath)
            except ReceiptError as exc:
                logger.warning("%s: %s; starting a new run", self.name, exc)
                marker = None
            resume_run_id = marker.run_id if marker is not None else None
        backend.bind_live_context(
            run,
            resume_run_id=resume_run_id,
            secrets=self._secrets,
            last_step_source=self._previous_last_step,
            progress=self.worker.progress if self.worker is not None else None,
        )
        try:
            backend.run_id = backend._setup()
        except Exception as exc:
            self._setup_error = backend.redact(f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
            logger.warning("%s: live setup failed, this backend is skipped: %s", self.name, self._setup_error)
            return
        if self._after_setup is not None:
            self._after_setup()  # e.g. the SDK registered its own exit hook during setup
        backend.reopened = backend.resume_run_id is not None and backend.run_id == backend.resume_run_id
        if not backend.reopened:
            write_marker(marker_fpath, self._new_marker())

    def _do_start_over(self) -> None:
        backend = self.backend
        if not backend.reopened or backend.run is None or backend.run_id is None:
            return
        old = backend.run_id
        try:
            backend._release_reopened()
        except Exception as exc:
            reason = backend.redact(str(exc))
            logger.warning("%s: could not let go of reopened run %s: %s", self.name, old, reason)
        marker_fpath = backend.run.run_id_marker_fpath(self.name)
        try:
            marker = read_marker(marker_fpath)
            if marker is not None and marker.run_id == old:
                marker_fpath.unlink()
        except (ReceiptError, OSError) as exc:
            logger.warning("%s: marker %s left in place: %s", self.name, marker_fpath, exc)
        self._do_setup(backend.run, resume=False)

    def _do_complete(self, identities: Callable[[], Mapping[str, str] | None] | None) -> None:
        run, run_id = self.backend.run, self.backend.run_id
        if run is None or run_id is None:
            return
        marker_fpath = run.run_id_marker_fpath(self.name)
        ids = identities() if identities is not None else None
        with self._marker_lock:
            if self._delivery_recorded:  # teardown gave up on this worker: too late to complete
                return
            marker = read_marker(marker_fpath) or self._new_marker()
            if marker.run_id != run_id:
                marker = self._new_marker()
            update = {
                "state": "completed",
                "completed_at": utc_now_iso(),
                "identities": dict(ids) if ids else None,
                "certified": None,  # the live run changed since an export completed it
            }
            write_marker(marker_fpath, marker.model_copy(update=update))

    def _do_teardown(self, status: RunStatus) -> None:
        if self._torn_down or not self._open():
            return
        self._torn_down = True
        self.backend._teardown(status)

    def record_logged(self, logged: Mapping[str, str | None], status: RunStatus) -> None:
        """Write into the marker what the live run logged (after teardown recorded the delivery)."""
        run, run_id = self.backend.run, self.backend.run_id
        if run is None or run_id is None or self._setup_error is not None:
            return
        marker_fpath = run.run_id_marker_fpath(self.name)
        with self._marker_lock:
            try:
                marker = read_marker(marker_fpath)
                if marker is None or marker.run_id != run_id:
                    return
                update = {"logged": dict(logged), "ended": status.value, "certified": None}
                write_marker(marker_fpath, marker.model_copy(update=update))
            except (ReceiptError, OSError) as exc:
                logger.warning("%s: logged content not recorded in %s: %s", self.name, marker_fpath, exc)

    # -- the marker ----------------------------------------------------------------------------------
    def _new_marker(self) -> RunIdMarker:
        backend = self.backend
        assert backend.run_id is not None
        key = backend.destination_key()
        return RunIdMarker(exporter=self.name, run_id=backend.run_id, destination_key=key)

    def _record_delivery(self, report: LiveReport) -> None:
        """Write into the marker whether every call reached the backend (the certify rule).

        A reopened run stays lossless only if the earlier process recorded that it was; when the
        earlier process recorded nothing (it was killed before its teardown), the whole run's
        delivery is unknown (None), never a loss of 0 calls.
        """
        run = self.backend.run
        if run is None or report.run_id is None:
            return
        marker_fpath = run.run_id_marker_fpath(self.name)
        with self._marker_lock:
            self._delivery_recorded = True
            try:
                marker = read_marker(marker_fpath)
                if marker is None or marker.run_id != report.run_id:
                    return
                reopened = self.backend.reopened
                earlier = marker.lossless if reopened else True
                this_ok = report.lost == 0 and report.teardown_finished
                lossless: bool | None = earlier if this_ok else False
                lost = (marker.lost_calls if reopened else 0) + report.lost
                update = {"lossless": lossless, "lost_calls": lost}
                write_marker(marker_fpath, marker.model_copy(update=update))
            except (ReceiptError, OSError) as exc:
                logger.warning("%s: delivery not recorded in %s: %s", self.name, marker_fpath, exc)
