"""Live logging that never slows or fails the eval: the fan-out from one call to every backend.

``live_run`` opens a ``LiveRun``: one call of the eval is journaled (``journal``) and
handed to one ``LiveChannel`` per enabled backend (``live_channel``: the worker, guards, marker
and report), which alone calls the backend's hooks (``contract.hooks.LiveHooks``, on ``LiveExporter``).
This module also holds the exit hook that tears down a run the eval left open.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gym_artifacts.contract.hooks import RunStatus
from gym_artifacts.contract.live_exporter import LiveExporter
from gym_artifacts.contract.registry import get_entry
from gym_artifacts.core.config import enabled_exporters, is_resume, normalize
from gym_artifacts.core.errors import GymArtifactsError
from gym_artifacts.core.locking import try_lock
from gym_artifacts.core.ranks import is_rank_zero
from gym_artifacts.core.secrets import install_log_redaction, mask_secrets, mask_text_metrics
from gym_artifacts.live.args import RefusedCalls, checked_metrics, normalize_step, rollouts_batch
from gym_artifacts.live.channel import (
    DEFAULT_TEARDOWN_TIMEOUT_S,
    LiveChannel,
    LiveReport,
    summary_line,
    teardown_limits,
)
from gym_artifacts.live.content import LoggedRollouts, logged_content
from gym_artifacts.live.journal_writer import MetricsJournal
from gym_artifacts.run.artifacts import FAILURES, ROLLOUTS, RunArtifacts
from gym_artifacts.run.metric_records import MetricRecord, encode_record
from gym_artifacts.run.run_config import backend_config, save_run_config

if TYPE_CHECKING:
    from gym_artifacts.live.handle import HandleReceiver, LiveHandle, NoOpHandle

logger = logging.getLogger(__name__)


class NoOpLiveRun:
    """What ranks other than 0 get, and a second live writer of one output: the same methods,
    doing nothing. ``writer_refused`` says why a writer was refused (None on other ranks)."""

    exporters: tuple[LiveExporter, ...] = ()
    channels: tuple[LiveChannel, ...] = ()
    reports: tuple[LiveReport, ...] = ()

    def __init__(self, writer_refused: str | None = None) -> None:
        self.writer_refused = writer_refused

    def __repr__(self) -> str:
        why = f"writer refused: {self.writer_refused}" if self.writer_refused else "not rank 0"
        return f"NoOpLiveRun({why})"

    def export_config(self, config: Mapping[str, Any] | None = None) -> None: ...
    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...
    def export_rollouts(self, rollouts: list[Any]) -> None: ...
    def start_over(self) -> None: ...
    def complete(self) -> None: ...
    def handle(self, host: str | None = None) -> NoOpHandle:
        from gym_artifacts.live.handle import NoOpHandle

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
                from gym_artifacts.run.identity import content_identities

                self._journal.flush(DEFAULT_TEARDOWN_TIMEOUT_S)
                try:
                    self._value = content_identities(self._run)
                except GymArtifactsError as exc:
                    logger.warning("cannot record the run's identities at completion: %s", exc)
                self._done = True
            return self._value


class LiveRun:
    """Every enabled live backend of one eval, each behind its ``LiveChannel``, plus the metrics
    journal, behind one set of calls. ``exporters`` are the backends, ``channels`` their channels
    (in the same order); the run reaches a backend only through its channel's public methods."""

    def __init__(
        self, run: RunArtifacts, exporters: list[LiveExporter], config: Any, *, resume: bool
    ) -> None:
        self.run = run
        self.exporters = tuple(exporters)
        self.channels = tuple(LiveChannel(e, after_setup=reregister_atexit) for e in self.exporters)
        self.config = config
        self.resume = resume
        self.reports: list[LiveReport] = []
        self.late = 0  # calls made once teardown began: sent nowhere, counted, warned once
        self._last_step: int | None = None
        self._closed = False
        self._owner_pid = os.getpid()  # a forked copy of this run ends nothing (see teardown)
        self.refused = RefusedCalls()
        self.logged_rollouts = LoggedRollouts()  # what was sent, to match OUT.jsonl at export
        install_log_redaction()
        masked, self._secrets = backend_config(config) if config is not None else ({}, frozenset())
        self._masked_config: dict[str, Any] = masked or {}
        self._receiver: HandleReceiver | None = None  # started by the first handle()
        self._handle_lock = threading.Lock()
        self.journal = MetricsJournal(run.metrics_journal_fpath, resume=resume)
        self._step_lock = threading.Lock()
        if resume:  # automatic steps continue after the last step an earlier process journaled
            self._last_step = self.journal.previous_last_step()
        for channel in self.channels:
            channel.setup(
                run, resume=resume, secrets=self._secrets, previous_last_step=self.journal.previous_last_step
            )
        _register_atexit(self)

    def __repr__(self) -> str:
        backends = ", ".join(c.name for c in self.channels) or "no backend"
        state = "closed" if self._closed else "open"
        return f"LiveRun({self.run.source}: {backends}; {state}; {self.refused.count} refused)"

    def export_config(self, config: Mapping[str, Any] | None = None) -> None:
        """Log the eval's config (masked) to every backend."""
        if self._closed and self._late("export_config"):
            return
        payload = self._masked_config if config is None else mask_secrets(dict(config), self._secrets)
        for channel in self.channels:
            channel.export_config(payload)

    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Journal one step's metrics and hand them to every backend; microseconds, never raises.

        A call that cannot be journaled (metrics not a mapping, a step that is no whole number)
        is refused, counted and reported at teardown; ``step=4.0`` and ``step="5"`` are read as
        integers.
        """
        self._export_metrics_at(metrics, step, time.time())

    def _export_metrics_at(self, metrics: Mapping[str, Any], step: Any, when: float) -> None:
        """``export_metrics`` with the caller's time (a live handle's calls keep theirs)."""
        if self._closed and self._late("export_metrics"):
            return
        try:
            checked = mask_text_metrics(checked_metrics(metrics), self._secrets)
            if step is None:
                self._export_at_next_step(checked, when)
                return
            step = normalize_step(step)
            record = encode_record(checked, step, when)
        except Exception as exc:  # never into the eval
            self.refused.add("export_metrics", exc)
            return
        self._last_step = step
        self.export_record(record)

    @property
    def journal_lost(self) -> int:
        """Metric calls the journal lost (queue full, disk failing, or after it closed)."""
        stats = self.journal.worker.stats
        return stats.dropped + stats.undelivered + stats.failed

    def _late(self, call: str) -> bool:
        """Whether teardown began (then ``call`` is counted in ``late``, warned about once, and
        sent nowhere: not to the journal, not to any backend, so all of them agree)."""
        if not self._closed:
            return False
        self.late += 1
        if self.late == 1:
            logger.warning(
                "live logging: %s called after teardown began for %s; not sent anywhere "
                "(further late calls are counted in live.late, not logged)", call, self.run.source,
            )  # fmt: skip
        return True

    def _export_at_next_step(self, checked: Mapping[str, Any], when: float) -> None:
        """The automatic step: the last step + 1, taken and handed on under one lock, so that
        threads logging at once get distinct steps that reach the journal and every backend in
        step order (W&B refuses a step that does not grow)."""
        with self._step_lock:
            step = 0 if self._last_step is None else self._last_step + 1
            record = encode_record(checked, step, when)
            self._last_step = step
            self.export_record(record)

    def export_record(self, record: MetricRecord) -> None:
        """Hand one encoded metric call (see ``metric_records``) to the journal and every backend."""
        self.journal.append_record(record)
        for channel in self.channels:
            channel.export_record(record)

    def handle(self, host: str | None = None) -> LiveHandle:
        """A picklable handle that Ray tasks and actors (any process that reaches ``host``) call
        like this run: their calls land in this run's journal and backend runs. ``host``: the
        address to listen on (default: Ray's node address when Ray runs here, else loopback)."""
        from gym_artifacts.live.handle import HandleReceiver, LiveHandle, default_host

        with self._handle_lock:
            if self._receiver is None:
                self._receiver = HandleReceiver(
                    self._export_metrics_at, self.export_rollouts, host or default_host()
                )
            host_, port = self._receiver.address
            return LiveHandle(host_, port, self._receiver.secret)

    def export_rollouts(self, rollouts: list[Any]) -> None:
        """Hand finished rollouts to every backend (the eval writes OUT.jsonl itself); never raises."""
        if self._closed and self._late("export_rollouts"):
            return
        try:
            batch = rollouts_batch(rollouts)
        except Exception as exc:  # never into the eval
            self.refused.add("export_rollouts", exc)
            return
        self.logged_rollouts.add(batch)
        for channel in self.channels:
            channel.export_rollouts(batch)

    def start_over(self) -> None:
        """Resume found nothing to resume: every reopened backend run is replaced by a new one."""
        if self._closed and self._late("start_over"):
            return
        if self.resume:
            self.journal.start_over()
            self._last_step = None
        for channel in self.channels:
            channel.start_over()

    def complete(self) -> None:
        """The eval finished: lets ``export --certify`` complete these live runs later."""
        if self._closed and self._late("complete"):
            return
        identities = _OnceIdentities(self.run, self.journal)
        for channel in self.channels:
            channel.complete(identities)

    def flush(self, timeout: float = DEFAULT_TEARDOWN_TIMEOUT_S) -> bool:
        """Wait until the journal and every backend applied what was handed to them."""
        deadline = time.monotonic() + timeout
        ok = self.journal.flush(timeout)
        for channel in self.channels:
            ok = channel.flush(max(0.0, deadline - time.monotonic())) and ok
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
        if os.getpid() != self._owner_pid:
            # A forked child (NeMo Gym's health-check workers) holds a copy of this run without
            # the threads that deliver it: the run is the parent's to end; nothing is reported.
            return self.reports
        self._closed = True
        if self._receiver is not None:  # handles' calls after this point are not applied
            self._receiver.close()
        timeout, hard_cap = teardown_limits(timeout, hard_cap)
        deadline = time.monotonic() + max(timeout, hard_cap)
        results: dict[str, LiveReport] = {}

        def end(channel: LiveChannel) -> None:
            results[channel.name] = channel.teardown(
                timeout, status, hard_cap=max(0.0, deadline - time.monotonic())
            )

        threads = [threading.Thread(target=end, args=(c,), daemon=True) for c in self.channels]
        for t in threads:
            t.start()
        journal_closed = self.journal.close(min(timeout, max(0.0, deadline - time.monotonic())))
        if self.journal_lost or not journal_closed:
            worker = self.journal.worker
            logger.warning(
                "live logging: the journal %s lost %d metric call(s): %s",
                self.journal.fpath, self.journal_lost, worker.stats.loss_causes(worker.max_queued, timeout),
            )  # fmt: skip
        if self.refused.count:
            logger.warning("live logging: %s", self.refused.describe())
        for t in threads:
            # Each exporter's teardown keeps the deadline itself; the grace covers the hand-back.
            t.join(max(0.0, deadline - time.monotonic()) + 0.5)
        for channel in self.channels:
            report = results.get(channel.name) or channel.report(finished=False)
            self.reports.append(report)
            if report.lost or report.setup_error or not report.teardown_finished:
                logger.warning("live logging: %s", report.describe())
        if status == RunStatus.FINISHED and journal_closed and not self.journal_lost:
            failures = self.run.sidecar_files().get(FAILURES)  # the sidecar the export would see
            logged = logged_content(self.journal.fpath, self.logged_rollouts, failures)
            if logged is not None:
                for channel in self.channels:
                    # a reopened run holds an earlier process's rollouts too: only the (resumed,
                    # whole) journal says what it logged
                    reopened = channel.backend.reopened
                    channel.record_logged(
                        {k: v for k, v in logged.items() if k != ROLLOUTS} if reopened else logged,
                        RunStatus.FINISHED,
                    )
        logger.info("live logging: teardown: %s", summary_line(self.reports))
        _unregister_atexit(self)
        return self.reports


_open_runs: list[LiveRun] = []
_atexit_lock = threading.Lock()


def _teardown_open_runs() -> None:
    for live in list(_open_runs):
        with contextlib.suppress(Exception):
            live.teardown(None, RunStatus.KILLED)


_before_shutdown: list[Any] = []


def at_interpreter_exit(fn: Any) -> None:
    """Call ``fn`` once when the interpreter exits, before its shutdown begins.

    ``atexit`` hooks run after ``threading``'s shutdown has started, when the SDKs can no longer
    start what a teardown needs (a thread pool: ``can't register atexit after shutdown``), so
    a run the eval never tore down would lose everything. ``threading``'s own exit hooks run
    first, while every thread is still alive; the thread pool module is imported before ours is
    registered, so ours (called in reverse order) runs before pools are shut down. Falls back
    to ``atexit`` on an interpreter without that hook.
    """
    import concurrent.futures.process
    import concurrent.futures.thread  # noqa: F401

    with _atexit_lock:
        if fn in _before_shutdown:
            return
        _before_shutdown.append(fn)
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hook")
        register(fn)
    except RuntimeError:
        atexit.register(fn)


def _register_atexit(live: LiveRun) -> None:
    """Registered (again) after the SDKs' own exit hooks, so ours runs first (atexit is LIFO),
    and before the interpreter's shutdown (:func:`at_interpreter_exit`), so that it delivers."""
    at_interpreter_exit(_teardown_open_runs)
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


def _forget_open_runs_after_fork() -> None:
    """A forked child (NeMo Gym's health-check workers) inherits the exit hook but none of the
    threads that deliver a run's calls: the runs stay the parent's, so the child's exit ends none
    of them (its teardown could only report losses that did not happen)."""
    global _atexit_lock
    _atexit_lock = threading.Lock()  # another thread may have held it at the fork
    _open_runs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_open_runs_after_fork)


def build_live_exporters(cfg: Any) -> list[LiveExporter]:
    """Every enabled backend that can log live; one that cannot be built is skipped alone."""
    exporters: list[LiveExporter] = []
    unresolvable: list[tuple[str, str]] = []
    names = enabled_exporters(cfg, unresolvable)
    for name, reason in unresolvable:
        logger.warning("%s: not logging live: %s", name, reason)
    for name in names:
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
def live_run(
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

    try:
        original = config if OmegaConf.is_config(config) else OmegaConf.create(config or {})
        cfg = normalize(original)
    except Exception as exc:  # a list, a cycle, a value that is gone: never raised into the eval
        logger.warning("live logging off: the config cannot be used: %s", exc)
        yield NoOpLiveRun(f"the config cannot be used: {exc}")
        return
    try:
        resume = is_resume(cfg)
    except GymArtifactsError as exc:
        logger.warning("live logging: %s; starting afresh (not resuming)", exc)
        resume = False
    run = RunArtifacts.from_path(output_jsonl_fpath)
    try:
        run.check_name_room(enabled_exporters(cfg, []), live=True)
    except GymArtifactsError as exc:
        logger.warning("live logging off: %s", exc)
        yield NoOpLiveRun(str(exc))
        return
    try:
        writer, holder = try_lock(run.live_writer_lock_fpath())
        refused = (
            f"{run.source} is being live-logged by {holder}; this process logs nothing live "
            "for it (one live writer per output: use another output path)"
        )
    except OSError as exc:  # a link or special file planted as the lock, a read-only folder
        writer = None
        refused = f"cannot take the live-writer lock: {exc.strerror}; this process logs nothing live"
    if writer is None:
        logger.warning("live logging refused: %s", refused)
        yield NoOpLiveRun(refused)
        return
    save_run_config(run, original)
    try:
        live = LiveRun(run, build_live_exporters(cfg), original, resume=resume)
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


def live_exporters(
    config: Any,
    output_jsonl_fpath: str | Any,
    *,
    teardown_timeout: float | None = None,
    teardown_hard_cap: float | None = None,
) -> contextlib.AbstractContextManager[LiveRun | NoOpLiveRun]:
    """Deprecated: the old name of :func:`live_run` (it yields a live run, not exporters); the same
    arguments, the same run, and a ``DeprecationWarning``."""
    warnings.warn(
        "gym_artifacts.live.live_exporters() is deprecated: use gym_artifacts.live.live_run() "
        "(the same arguments)",
        DeprecationWarning,
        stacklevel=2,
    )
    return live_run(
        config, output_jsonl_fpath, teardown_timeout=teardown_timeout, teardown_hard_cap=teardown_hard_cap
    )
