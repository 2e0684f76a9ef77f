"""LiveExporter: the base class of a backend that can follow a running eval.

It holds what its hooks (``contract.hooks.LiveHooks``) read, nothing more: the eval never calls
it. A ``LiveChannel`` wraps it and runs its hooks on a worker thread; that thread alone sets this
context, once per setup (``bind_live_context``), before the backend's ``_setup`` runs. Whether a
post-run export certifies its live run is decided by the export engine alone
(``export.certify.export_live``); this class never imports it. Only the hooks are the backend's
to implement. ``LiveTracing`` is the opt-in part of a backend that sends rollouts as traces live.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import LiveHooks
from gym_artifacts.core.secrets import redact_text

if TYPE_CHECKING:
    from gym_artifacts.contract.live_traces import LiveTraces, TraceCounts
    from gym_artifacts.run.artifacts import RunArtifacts


class LiveExporter(LiveHooks, Exporter):
    """An exporter that can also follow a running eval.

    Context its hooks read, bound once per setup on the channel's worker thread
    (``bind_live_context``): ``run`` (the eval's output), ``resume_run_id`` (the marker's run when
    resuming), ``secrets`` (values to keep out of anything sent) and ``previous_last_step()``.
    What the setup opened, set by the same thread: ``run_id`` (the open backend run) and
    ``reopened``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A backend written for the old contract, whose post-run hook was ``_export_post_run``,
        keeps working: that method is its ``_export`` (with a DeprecationWarning)."""
        super().__init_subclass__(**kwargs)
        if "_export_post_run" in vars(cls) and "_export" not in vars(cls):
            warnings.warn(
                f"{cls.__qualname__}._export_post_run: name the post-run hook _export (docs/plugins.md)",
                DeprecationWarning,
                stacklevel=2,
            )
            cls._export = vars(cls)["_export_post_run"]  # type: ignore[method-assign]

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.run: RunArtifacts | None = None
        self.resume_run_id: str | None = None
        self.run_id: str | None = None
        self.reopened = False
        self.secrets: frozenset[str] = frozenset()
        self.last_step_source: Callable[[], int | None] | None = None
        self.progress_signal: Callable[[], None] | None = None

    def bind_live_context(
        self,
        run: RunArtifacts,
        *,
        resume_run_id: str | None,
        secrets: frozenset[str],
        last_step_source: Callable[[], int | None] | None,
        progress: Callable[[], None] | None = None,
    ) -> None:
        """Set what the hooks read for one live run (the channel's worker thread calls this);
        ``progress``: what ``live_progress`` tells."""
        self.progress_signal = progress
        self.run = run
        self.resume_run_id = resume_run_id
        self.secrets = secrets
        self.last_step_source = last_step_source
        self.run_id = None
        self.reopened = False

    def live_progress(self) -> None:
        """Tell the channel that a long hook is making progress (a batch of traces landed): a
        teardown waiting on it restarts its idle deadline (its hard cap still holds)."""
        if self.progress_signal is not None:
            self.progress_signal()

    def previous_last_step(self) -> int | None:
        """For a resumed run: the last step an earlier process logged (from the journal)."""
        return self.last_step_source() if self.last_step_source is not None else None

    def redact(self, text: str) -> str:
        """``text`` with this run's secrets replaced."""
        return redact_text(text, self.secrets)


class LiveTracing:
    """Opt-in for a live backend that sends rollouts as traces while the eval runs (MLflow,
    Phoenix and LangSmith subclass ``LiveTracing, LiveExporter``): its ``_setup`` sets
    ``live_traces`` (a ``LiveTraces`` queue over its platform's batch send) and its
    ``_log_rollouts`` calls ``trace_rollouts``. Its channel then gives the queue more turns while
    the eval runs and reports what the platform took (``live_trace_counts``) at teardown."""

    live_traces: LiveTraces | None = None

    def trace_rollouts(self, batches: list[list[Any]]) -> None:
        """Queue rollouts as traces and send what is due (``live_traces``; none: nothing)."""
        traces = self.live_traces
        if traces is not None:
            for rollouts in batches:
                traces.add(rollouts)
            traces.send_pending()

    def live_trace_counts(self) -> TraceCounts | None:
        """How many of the live run's rollouts the platform took as traces (None: no queue was
        set up); read for the teardown report once the worker stopped."""
        return self.live_traces.counts if self.live_traces is not None else None
