"""Live logging that never slows or fails the eval: LiveExporter, its wrappers, and the fan-out.

Backends implement the hooks declared in ``gym_artifacts.backend.LiveHooks`` and may raise freely.
Call sites use the wrappers, which only enqueue onto the exporter's background worker: lifecycle
requests (setup, start over, complete, teardown) travel through the same queue, so only the
worker thread touches a backend's run.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.backend import CannotCertify, LiveHooks, RunStatus
from gym_artifacts.config import enabled_exporters, is_resume, normalize
from gym_artifacts.errors import GymArtifactsError, ReceiptError
from gym_artifacts.exporter import CERTIFIED_NOTE, Exporter, ExportPlan, Sent
from gym_artifacts.journal import MetricsJournal
from gym_artifacts.live_args import RefusedCalls, checked_metrics, normalize_step, rollouts_batch
from gym_artifacts.locking import try_lock
from gym_artifacts.metric_records import MetricRecord, encode_record
from gym_artifacts.payload import backend_config, save_run_config
from gym_artifacts.ranks import is_rank_zero
from gym_artifacts.receipts import RunIdMarker, read_marker, utc_now_iso, write_marker
from gym_artifacts.registry import get_entry
from gym_artifacts.run import RunArtifacts
from gym_artifacts.secrets import install_log_redaction, mask_secrets, redact_text
from gym_artifacts.worker import BackgroundWorker, Call, RecordSink, WorkerStats

if TYPE_CHECKING:
    from gym_artifacts.live_handle import HandleReceiver, LiveHandle, NoOpHandle

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
        return ", ".join(parts)


class LiveExporter(LiveHooks, Exporter):
    """An exporter that can also follow a running eval.

    Worker-thread state: ``run`` (the eval's output), ``resume_run_id`` (the marker's run when
    resuming), ``run_id`` (the open backend run) and ``reopened``.
    """

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.run: RunArtifacts | None = None
        self.resume_run_id: str | None = None
        self.run_id: str | None = None
        self.reopened = False
        self._worker: BackgroundWorker | None = None
        self._setup_error: str | None = None
        self._secrets: frozenset[str] = frozenset()
        self._torn_down = False
        # The marker is rewritten by the worker (complete) and by teardown (delivery record);
        # once teardown recorded the delivery, a late complete() from the worker never lands.
        self._marker_lock = threading.Lock()
        self._delivery_recorded = False
        self._skipped = 0
        self._report: LiveReport | None = None
        self._previous_last_step: Callable[[], int | None] | None = None

    # -- post-run export with certify / supersede ---------------------------------------------------
    def certify_refusal(self, marker: RunIdMarker, plan: ExportPlan) -> str | None:
        """Why the live run of ``marker`` may not be completed by this export (None: it may).

        Only a run the eval ``complete()``d, whose teardown delivered every call (recorded in
        the marker), whose files did not change since, and that lives at this destination.
        ``plan.certify`` False never certifies; True also accepts a marker from before the
        loss record (``lossless`` unknown), never one that lost calls.
        """
        if plan.certify is False:
            return "--no-certify"
        if marker.destination_key not in (None, self.destination_key()):
            return "it lives at another destination"
        if marker.state != "completed":
            return "the eval never called complete()"
        if marker.lossless is False:
            return f"it lost {marker.lost_calls} live call(s): its history is incomplete"
        if marker.lossless is None and plan.certify is not True:
            return "its delivery was not recorded (pass --certify to complete it anyway)"
        if marker.identities != plan.identities:
            return "the run changed since it completed"
        return None

    # -- post-run export with certify / supersede ---------------------------------------------------
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        marker_fpath = run.run_id_marker_fpath(self.name)
        try:
            marker = read_marker(marker_fpath)
        except ReceiptError as exc:
            logger.warning("%s", exc)
            marker = None
        if marker is not None and marker.destination_key not in (None, self.destination_key()):
            marker = None  # a live run elsewhere: neither certified nor superseded by this export
        if marker is not None:
            refusal = self.certify_refusal(marker, plan)
            if refusal is None:
                try:
                    sent = self._certify(run, plan, marker.run_id)
                except CannotCertify as exc:
                    logger.info("%s: live run %s not certified: %s", self.name, marker.run_id, exc)
                else:
                    return Sent(sent.backend_run_id, sent.rows, sent.bytes, CERTIFIED_NOTE)
            else:
                logger.info("%s: live run %s not certified (%s); exporting a new run",
                            self.name, marker.run_id, refusal)  # fmt: skip
        sent = self._export_post_run(run, plan)
        if marker is not None and marker.run_id != sent.backend_run_id:
            try:
                self._mark_superseded(marker.run_id, sent.backend_run_id or "")
                write_marker(marker_fpath, marker.model_copy(update={"superseded_by": sent.backend_run_id}))
            except Exception as exc:  # best effort: never fail an export for a courtesy note
                logger.warning("%s: could not mark live run %s superseded: %s", self.name, marker.run_id, exc)
        return sent

    # -- wrappers: enqueue only, never raise, never block on the backend -------------------------------
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
        self._secrets = frozenset(secrets)
        self._previous_last_step = previous_last_step
        records = RecordSink(self._guarded(self._log_metrics), self._guarded_batch(self._log_metrics_batch))
        self._worker = BackgroundWorker(self.name, redact=self.redact, records=records)
        self._worker.submit(Call(self._do_setup, (run, resume), "setup"))

    def export_config(self, config: Mapping[str, Any]) -> None:
        """Log the config (masked again here: a caller may pass an unmasked one)."""
        try:
            masked = mask_secrets(dict(config), self._secrets)
        except Exception as exc:
            logger.warning("%s: config not logged: %s", self.name, self.redact(str(exc)))
            return
        self._submit(Call(self._guarded(self._log_config), (masked,), "config"))

    def export_metrics(
        self, metrics: Mapping[str, Any], step: int | None = None, *, timestamp: float | None = None
    ) -> None:
        """Log step metrics (dropped first when the queue is full)."""
        when = time.time() if timestamp is None else timestamp
        self._enqueue_record(encode_record(metrics, step, when))

    def _enqueue_record(self, record: MetricRecord) -> None:
        """The fan-out's fast path: one record, encoded once, shared by every backend."""
        worker = self._worker
        if worker is not None:
            worker.submit_record(record)

    def export_rollouts(self, rollouts: list[Any]) -> None:
        """Log finished rollouts (never dropped)."""
        self._submit(Call(self._guarded(self._log_rollouts), (list(rollouts),), "rollouts"))

    def start_over(self) -> None:
        """Resume found nothing to resume: close the reopened run and open a new one."""
        self._submit(Call(self._do_start_over, (), "start_over"))

    def complete(self, identities: Callable[[], Mapping[str, str] | None] | None = None) -> None:
        """Record that the eval finished, so ``export --certify`` may complete this live run."""
        self._submit(Call(self._do_complete, (identities,), "complete"))

    def flush(self, timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S) -> bool:
        """Wait (up to ``timeout``) until every earlier call was applied."""
        return self._worker.flush(timeout) if self._worker is not None else True

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
        worker = self._worker
        if worker is None:
            self._report = LiveReport(self.name, None, "setup never ran", 0, 0, 0, 0, True)
            return self._report
        worker.submit(Call(self._do_teardown, (status,), "teardown"))
        self._report = self.report(finished=worker.stop(timeout, hard_cap))
        self._record_delivery(self._report)
        return self._report

    def report(self, *, finished: bool) -> LiveReport:
        """What this backend received so far (calls still queued count as undelivered)."""
        worker = self._worker
        if worker is None:
            return LiveReport(self.name, None, "setup never ran", 0, 0, 0, 0, finished)
        stats: WorkerStats = worker.stats
        queued = 0 if finished else worker.pending
        return LiveReport(
            exporter=self.name,
            run_id=self.run_id,
            setup_error=self._setup_error,
            delivered=stats.delivered - self._skipped,
            failed=stats.failed,
            dropped=stats.dropped,
            undelivered=max(stats.undelivered, queued) + self._skipped,
            teardown_finished=finished,
            last_error=stats.last_error,
            dropped_kinds=dict(stats.dropped_kinds),
        )

    def previous_last_step(self) -> int | None:
        """For a resumed run: the last step an earlier process logged (from the journal)."""
        return self._previous_last_step() if self._previous_last_step is not None else None

    @property
    def stats(self) -> WorkerStats | None:
        return self._worker.stats if self._worker is not None else None

    def redact(self, text: str) -> str:
        return redact_text(text, self._secrets)

    def _submit(self, call: Call) -> None:
        if self._worker is None:
            return
        self._worker.submit(call)

    def _guarded(self, hook: Callable[..., None]) -> Callable[..., None]:
        """A hook that is skipped (not counted as a failure) once setup failed."""

        def apply(*args: Any) -> None:
            if self._setup_error is not None or self.run_id is None:
                self._skipped += 1  # counted as undelivered, without backing off
                return
            hook(*args)

        return apply

    def _guarded_batch(self, hook: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        def apply(entries: list[Any]) -> None:
            if self._setup_error is not None or self.run_id is None:
                self._skipped += len(entries)
                return
            hook(entries)

        return apply

    # -- lifecycle on the worker thread ------------------------------------------------------------------
    def _do_setup(self, run: RunArtifacts, resume: bool) -> None:
        self.run = run
        marker_fpath = run.run_id_marker_fpath(self.name)
        self.resume_run_id = None
        if resume:
            try:
                marker = read_marker(marker_fpath)
            except ReceiptError as exc:
                logger.warning("%s: %s; starting a new run", self.name, exc)
                marker = None
            self.resume_run_id = marker.run_id if marker is not None else None
        try:
            self.run_id = self._setup()
        except Exception as exc:
            self._setup_error = self.redact(f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
            logger.warning("%s: live setup failed, this backend is skipped: %s", self.name, self._setup_error)
            return
        reregister_atexit()  # the SDK may have registered its own exit hook during setup
        self.reopened = self.resume_run_id is not None and self.run_id == self.resume_run_id
        if not self.reopened:
            write_marker(marker_fpath, self._new_marker())

    def _do_start_over(self) -> None:
        if not self.reopened or self.run is None or self.run_id is None:
            return
        old = self.run_id
        try:
            self._release_reopened()
        except Exception as exc:
            logger.warning(
                "%s: could not let go of reopened run %s: %s", self.name, old, self.redact(str(exc))
            )
        self.reopened = False
        self.run_id = None
        marker_fpath = self.run.run_id_marker_fpath(self.name)
        try:
            marker = read_marker(marker_fpath)
            if marker is not None and marker.run_id == old:
                marker_fpath.unlink()
        except (ReceiptError, OSError) as exc:
            logger.warning("%s: marker %s left in place: %s", self.name, marker_fpath, exc)
        self._do_setup(self.run, resume=False)

    def _do_complete(self, identities: Callable[[], Mapping[str, str] | None] | None) -> None:
        if self.run is None or self.run_id is None:
            return
        marker_fpath = self.run.run_id_marker_fpath(self.name)
        ids = identities() if identities is not None else None
        with self._marker_lock:
            if self._delivery_recorded:  # teardown gave up on this worker: too late to complete
                return
            marker = read_marker(marker_fpath) or self._new_marker()
            if marker.run_id != self.run_id:
                marker = self._new_marker()
            update = {
                "state": "completed",
                "completed_at": utc_now_iso(),
                "identities": dict(ids) if ids else None,
            }
            write_marker(marker_fpath, marker.model_copy(update=update))

    def _new_marker(self) -> RunIdMarker:
        assert self.run_id is not None
        return RunIdMarker(exporter=self.name, run_id=self.run_id, destination_key=self.destination_key())

    def _record_delivery(self, report: LiveReport) -> None:
        """Write into the marker whether every call reached the backend (the certify rule).

        A reopened run stays lossless only if the earlier process recorded that it was.
        """
        if self.run is None or report.run_id is None:
            return
        marker_fpath = self.run.run_id_marker_fpath(self.name)
        with self._marker_lock:
            self._delivery_recorded = True
            self._write_delivery(marker_fpath, report)

    def _write_delivery(self, marker_fpath: Path, report: LiveReport) -> None:
        try:
            marker = read_marker(marker_fpath)
            if marker is None or marker.run_id != report.run_id:
                return
            earlier_ok = marker.lossless is True if self.reopened else True
            lossless = earlier_ok and report.lost == 0 and report.teardown_finished
            lost = (marker.lost_calls if self.reopened else 0) + report.lost
            write_marker(marker_fpath, marker.model_copy(update={"lossless": lossless, "lost_calls": lost}))
        except (ReceiptError, OSError) as exc:
            logger.warning("%s: delivery not recorded in %s: %s", self.name, marker_fpath, exc)

    def _do_teardown(self, status: RunStatus) -> None:
        if self._torn_down or self._setup_error is not None or self.run_id is None:
            return
        self._torn_down = True
        self._teardown(status)


class NoOpLiveRun:
    """What ranks other than 0 get, and a second live writer of one output: the same methods,
    doing nothing. ``writer_refused`` says why a writer was refused (None on other ranks)."""

    exporters: tuple[LiveExporter, ...] = ()
    reports: tuple[LiveReport, ...] = ()

    def __init__(self, writer_refused: str | None = None) -> None:
        self.writer_refused = writer_refused

    def export_config(self, config: Mapping[str, Any] | None = None) -> None: ...
    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...
    def export_rollouts(self, rollouts: list[Any]) -> None: ...
    def start_over(self) -> None: ...
    def complete(self) -> None: ...
    def handle(self, host: str | None = None) -> NoOpHandle:
        from gym_artifacts.live_handle import NoOpHandle

        return NoOpHandle()

    def flush(self, timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S) -> bool:
        return True

    def teardown(
        self,
        timeout: float | None = None,
        status: RunStatus = RunStatus.FINISHED,
        hard_cap: float | None = None,
    ) -> list[LiveReport]:
        return []


class _OnceIdentities:
    """The run's identities computed once (after the journal is flushed), shared by all exporters."""

    def __init__(self, run: RunArtifacts, journal: MetricsJournal) -> None:
        self._run = run
        self._journal = journal
        self._lock = threading.Lock()
        self._value: dict[str, str] | None = None
        self._done = False

    def __call__(self) -> dict[str, str] | None:
        with self._lock:
            if not self._done:
                from gym_artifacts.identity import content_identities

                self._journal.flush(DEFAULT_TEARDOWN_TIMEOUT_S)
                try:
                    self._value = content_identities(self._run)
                except GymArtifactsError as exc:
                    logger.warning("cannot record the run's identities at completion: %s", exc)
                self._done = True
            return self._value


class LiveRun:
    """Every enabled live exporter of one eval, plus the metrics journal, behind one set of calls."""

    def __init__(
        self, run: RunArtifacts, exporters: list[LiveExporter], config: Any, *, resume: bool
    ) -> None:
        self.run = run
        self.exporters = tuple(exporters)
        self.config = config
        self.resume = resume
        self.reports: list[LiveReport] = []
        self.journal_lost = 0
        self._last_step: int | None = None
        self._closed = False
        self.refused = RefusedCalls()
        install_log_redaction()
        masked, self._secrets = backend_config(config) if config is not None else ({}, frozenset())
        self._masked_config: dict[str, Any] = masked or {}
        self._receiver: HandleReceiver | None = None  # started by the first handle()
        self._handle_lock = threading.Lock()
        self.journal = MetricsJournal(run.metrics_journal_fpath, resume=resume)
        for exporter in self.exporters:
            exporter.setup(
                run, resume=resume, secrets=self._secrets, previous_last_step=self.journal.previous_last_step
            )
        _register_atexit(self)

    def export_config(self, config: Mapping[str, Any] | None = None) -> None:
        """Log the eval's config (masked) to every backend."""
        payload = self._masked_config if config is None else mask_secrets(dict(config), self._secrets)
        for exporter in self.exporters:
            exporter.export_config(payload)

    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Journal one step's metrics and hand them to every backend; microseconds, never raises.

        A call that cannot be journaled (metrics not a mapping, a step that is no whole number)
        is refused, counted and reported at teardown; ``step=4.0`` and ``step="5"`` are read as
        integers.
        """
        self._export_metrics_at(metrics, step, time.time())

    def _export_metrics_at(self, metrics: Mapping[str, Any], step: Any, when: float) -> None:
        """``export_metrics`` with the caller's time (a live handle's calls keep theirs)."""
        try:
            checked = checked_metrics(metrics)
            if step is None:
                step = 0 if self._last_step is None else self._last_step + 1
            else:
                step = normalize_step(step)
            record = encode_record(checked, step, when)
        except Exception as exc:  # never into the eval
            self.refused.add("export_metrics", exc)
            return
        self._last_step = step
        self.export_record(record)

    def export_record(self, record: MetricRecord) -> None:
        """Hand one encoded metric call (see ``metric_records``) to the journal and every backend."""
        self.journal.append_record(record)
        for exporter in self.exporters:
            exporter._enqueue_record(record)

    def handle(self, host: str | None = None) -> LiveHandle:
        """A picklable handle that Ray tasks and actors (any process that reaches ``host``) call
        like this run: their calls land in this run's journal and backend runs. ``host``: the
        address to listen on (default: Ray's node address when Ray runs here, else loopback)."""
        from gym_artifacts.live_handle import HandleReceiver, LiveHandle, default_host

        with self._handle_lock:
            if self._receiver is None:
                self._receiver = HandleReceiver(
                    self._export_metrics_at, self.export_rollouts, host or default_host()
                )
            host_, port = self._receiver.address
            return LiveHandle(host_, port, self._receiver.secret)

    def export_rollouts(self, rollouts: list[Any]) -> None:
        """Hand finished rollouts to every backend (the eval writes OUT.jsonl itself); never raises."""
        try:
            batch = rollouts_batch(rollouts)
        except Exception as exc:  # never into the eval
            self.refused.add("export_rollouts", exc)
            return
        for exporter in self.exporters:
            exporter.export_rollouts(batch)

    def start_over(self) -> None:
        """Resume found nothing to resume: every reopened backend run is replaced by a new one."""
        if self.resume:
            self.journal.start_over()
            self._last_step = None
        for exporter in self.exporters:
            exporter.start_over()

    def complete(self) -> None:
        """The eval finished: lets ``export --certify`` complete these live runs later."""
        identities = _OnceIdentities(self.run, self.journal)
        for exporter in self.exporters:
            exporter.complete(identities)

    def flush(self, timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S) -> bool:
        """Wait until the journal and every backend applied what was handed to them."""
        deadline = time.monotonic() + timeout
        ok = self.journal.flush(timeout)
        for exporter in self.exporters:
            ok = exporter.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def teardown(
        self,
        timeout: float | None = None,
        status: RunStatus = RunStatus.FINISHED,
        hard_cap: float | None = None,
    ) -> list[LiveReport]:
        """End every backend run; returns what each received.

        Each backend is waited for while it makes progress: ``timeout`` seconds without a
        delivered call ends the wait, ``hard_cap`` seconds end it in any case (defaults:
        ``GYM_ARTIFACTS_TEARDOWN_IDLE_S`` / ``GYM_ARTIFACTS_TEARDOWN_MAX_S``, else 10 s / 60 s).
        """
        if self._closed:
            return self.reports
        self._closed = True
        if self._receiver is not None:  # handles' calls after this point are not applied
            self._receiver.close()
        timeout, hard_cap = teardown_limits(timeout, hard_cap)
        deadline = time.monotonic() + max(timeout, hard_cap)
        results: dict[str, LiveReport] = {}

        def end(exporter: LiveExporter) -> None:
            results[exporter.name] = exporter.teardown(
                timeout, status, hard_cap=max(0.0, deadline - time.monotonic())
            )

        threads = [threading.Thread(target=end, args=(e,), daemon=True) for e in self.exporters]
        for t in threads:
            t.start()
        journal_closed = self.journal.close(min(timeout, max(0.0, deadline - time.monotonic())))
        journal_stats = self.journal.worker.stats
        self.journal_lost = journal_stats.dropped + journal_stats.undelivered + journal_stats.failed
        if self.journal_lost or not journal_closed:
            logger.warning(
                "live logging: the journal %s lost %d metric call(s) (queue full or disk failing: %s)",
                self.journal.fpath, self.journal_lost, journal_stats.last_error,
            )  # fmt: skip
        if self.refused.count:
            logger.warning("live logging: %s", self.refused.describe())
        for t in threads:
            # Each exporter's teardown keeps the deadline itself; the grace covers the hand-back.
            t.join(max(0.0, deadline - time.monotonic()) + 0.5)
        for exporter in self.exporters:
            report = results.get(exporter.name) or exporter.report(finished=False)
            self.reports.append(report)
            if report.lost or report.setup_error or not report.teardown_finished:
                logger.warning("live logging: %s", report.describe())
        _unregister_atexit(self)
        return self.reports


_open_runs: list[LiveRun] = []
_atexit_lock = threading.Lock()


def _teardown_open_runs() -> None:
    for live in list(_open_runs):
        with contextlib.suppress(Exception):
            live.teardown(None, RunStatus.KILLED)


def _register_atexit(live: LiveRun) -> None:
    """Registered (again) after the SDKs' own exit hooks, so ours runs first (atexit is LIFO)."""
    with _atexit_lock:
        _open_runs.append(live)
        atexit.unregister(_teardown_open_runs)
        atexit.register(_teardown_open_runs)


def _unregister_atexit(live: LiveRun) -> None:
    with _atexit_lock:
        if live in _open_runs:
            _open_runs.remove(live)


def reregister_atexit() -> None:
    """Move our exit hook after any SDK's (call after a backend SDK initialised)."""
    with _atexit_lock:
        atexit.unregister(_teardown_open_runs)
        atexit.register(_teardown_open_runs)


def build_live_exporters(cfg: Any) -> list[LiveExporter]:
    """Every enabled backend that can log live; one that cannot be built is skipped alone."""
    exporters: list[LiveExporter] = []
    for name in enabled_exporters(cfg):
        try:
            entry = get_entry(name)
            if not entry.sdk_installed():
                logger.warning("%s: its SDK is not installed; not logging to it live", name)
                continue
            cls = entry.load()
            if not issubclass(cls, LiveExporter):
                logger.info("%s: backend has no live logging; use the post-run export", name)
                continue
            exporters.append(cls.from_global_config(cfg))
        except GymArtifactsError as exc:
            logger.warning("%s: not logging live: %s", name, exc)
    return exporters


@contextlib.contextmanager
def live_exporters(
    config: Any,
    output_jsonl_fpath: str | Any,
    *,
    teardown_timeout: float | None = None,
    teardown_hard_cap: float | None = None,
) -> Iterator[LiveRun | NoOpLiveRun]:
    """Live-log an eval whose rollouts go to ``output_jsonl_fpath`` to every enabled backend.

    Yields an object with ``export_config``, ``export_metrics``, ``export_rollouts``,
    ``start_over``, ``complete`` and ``flush``; the config is saved as ``OUT_config.yaml``
    (unresolved) when the eval saved none, the masked config is logged at entry and every
    backend torn down at exit (FAILED when the block raised, KILLED when interrupted). Ranks
    other than 0 get a no-op object.

    One live writer per output: while a process live-logs into an output, a second one (any
    process, this one included) is refused for it: a warning names the holder and it gets a
    no-op object (``writer_refused`` says why), so two evals never mix in one journal, marker or
    backend run. The lock is the kernel's: a writer that died holds nothing.
    """
    if not is_rank_zero():
        yield NoOpLiveRun()
        return
    from omegaconf import OmegaConf

    original = config if OmegaConf.is_config(config) else OmegaConf.create(config or {})
    cfg = normalize(original)
    run = RunArtifacts.from_path(output_jsonl_fpath)
    writer, holder = try_lock(run.live_writer_lock_fpath())
    if writer is None:
        refused = (
            f"{run.source} is being live-logged by {holder}; this process logs nothing live "
            "for it (one live writer per output: use another output path)"
        )
        logger.warning("live logging refused: %s", refused)
        yield NoOpLiveRun(refused)
        return
    save_run_config(run, original)
    try:
        live = LiveRun(run, build_live_exporters(cfg), original, resume=is_resume(cfg))
        live.export_config()
        status = RunStatus.FINISHED
        try:
            yield live
        except (KeyboardInterrupt, SystemExit):
            status = RunStatus.KILLED
            raise
        except BaseException:
            status = RunStatus.FAILED
            raise
        finally:
            live.teardown(teardown_timeout, status, teardown_hard_cap)
    finally:
        writer.release()
