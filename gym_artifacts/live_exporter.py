"""LiveExporter: the base class of a backend that can follow a running eval.

It holds what its hooks (``backend.LiveHooks``) read, nothing more: the eval never calls it.
A ``LiveChannel`` wraps it, runs its hooks on a worker thread and sets this context before
each lifecycle step. Whether a post-run export certifies its live run is decided by the
export engine alone (``export._send``, policy in ``live_certify``); this class never imports
it. Only the hooks are the backend's to implement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gym_artifacts.backend import LiveHooks
from gym_artifacts.exporter import Exporter
from gym_artifacts.secrets import redact_text

if TYPE_CHECKING:
    from gym_artifacts.backend import ExportPlan, Sent
    from gym_artifacts.run import RunArtifacts


class LiveExporter(LiveHooks, Exporter):
    """An exporter that can also follow a running eval.

    Context its hooks read (set by the channel, on the worker thread): ``run`` (the eval's
    output), ``resume_run_id`` (the marker's run when resuming), ``run_id`` (the open backend
    run), ``reopened``, ``secrets`` (values to keep out of anything sent) and
    ``previous_last_step()``.
    """

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self.run: RunArtifacts | None = None
        self.resume_run_id: str | None = None
        self.run_id: str | None = None
        self.reopened = False
        self.secrets: frozenset[str] = frozenset()
        self.last_step_source: Callable[[], int | None] | None = None

    def previous_last_step(self) -> int | None:
        """For a resumed run: the last step an earlier process logged (from the journal)."""
        return self.last_step_source() if self.last_step_source is not None else None

    def redact(self, text: str) -> str:
        """``text`` with this run's secrets replaced."""
        return redact_text(text, self.secrets)

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        """The post-run hook, for a live backend: a new backend run (``_export_post_run``).

        Whether a live run of the same eval is completed instead is not the backend's call: the
        export engine decides it (``export._send`` with ``live_certify.certify_or_export``).
        """
        return self._export_post_run(run, plan)
