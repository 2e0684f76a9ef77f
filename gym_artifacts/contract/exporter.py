"""The Exporter base: builds a backend from its config section and turns expected failures into results.

The hooks and the types a backend deals in are declared in ``gym_artifacts.contract.hooks``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from gym_artifacts.contract.hooks import ExportPlan, ExportResult, ExportStatus, PostRunHooks, Sent
from gym_artifacts.core.config import ExporterConfig, exporter_section, validate_settings
from gym_artifacts.core.destination import Destination, default_destination, destination_key
from gym_artifacts.core.errors import GymArtifactsError
from gym_artifacts.core.secrets import redact_text

if TYPE_CHECKING:
    from typing_extensions import Self

    from gym_artifacts.contract.comparison import ComparisonPayload
    from gym_artifacts.run.artifacts import RunArtifacts

logger = logging.getLogger(__name__)


class Exporter(PostRunHooks):
    """A backend that can receive a finished run.

    Subclasses set ``name`` and ``config_model`` and implement ``_export``, which may raise;
    ``export`` turns expected failures into a FAILED result and raises only for a bug.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[ExporterConfig]] = ExporterConfig
    # The top-level module of the backend's SDK: checked without importing it.
    sdk_module: ClassVar[str | None] = None
    # True: ``_export`` may be given a plan whose identities are still being hashed
    # (``ExportPlan.identities_pending``); it finds its run by ``plan.send_key`` and calls
    # ``plan.complete()`` before tagging the run with the identity. False: the engine waits for
    # the identities before calling it.
    hashes_while_sending: ClassVar[bool] = False
    # True: the backend logs every rollout's numbers and end time (``rollout_row_values``); the
    # export's one read of the rollouts then gives them, so the backend need not parse the file.
    reads_row_values: ClassVar[bool] = False

    def __init__(self, settings: ExporterConfig) -> None:
        self.settings = settings

    @classmethod
    def settings_from(cls, cfg: Any) -> ExporterConfig:
        """This backend's validated settings from the whole config (nothing built)."""
        return validate_settings(cls.config_model, exporter_section(cfg, cls.name), cls.name)

    @classmethod
    def from_global_config(cls, cfg: Any) -> Self:
        """Build from the whole config, validating this backend's section first."""
        return cls(cls.settings_from(cfg))

    @classmethod
    def destination_for(cls, settings: Any) -> Destination:
        """Where runs sent with these (validated) settings go: stable, JSON-safe, no credentials.

        The hook a backend overrides. Receipts are kept per destination: an export skips only
        when a receipt for the same exporter *and* destination matches the run. It is computed
        from the settings alone, before the backend is built (a skipped export builds and
        contacts nothing). The default is every setting except ``enabled`` and secrets; a
        backend narrows it to what selects the store (MLflow: tracking URI and experiment), so
        that a changed timeout is not a new destination.
        """
        return default_destination(settings)

    @classmethod
    def prepare_destination(cls, settings: Any) -> None:
        """Make the destination ready for many exports at once (the hook a backend overrides).

        Called once per destination by the driver of a parallel export (``--jobs``, Ray) before
        any run is sent, so that a one-time setup (MLflow creating a new SQLite store's schema)
        never races in every task. May raise; the exports then report the problem per run.
        """
        return None

    def destination(self) -> Destination:
        """This exporter's destination (``destination_for`` of its settings)."""
        return type(self).destination_for(self.settings)

    def destination_key(self) -> str:
        """The short key of ``destination()`` that receipts and live markers record."""
        return destination_key(self.destination())

    def backend_run_exists(self, backend_run_id: str) -> bool | None:
        """Whether the backend still holds this run (``--verify``); None when it cannot tell.

        May contact the backend and raise its expected errors; the default cannot tell.
        """
        return None

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean the backend refused or is unreachable, not a bug of ours."""
        return (GymArtifactsError, OSError)

    def export_deadline_s(self) -> float | None:
        """Seconds the whole send may take (every request and retry), enforced by a watchdog that
        abandons it (``gym_artifacts.core.watchdog``); None: no deadline (a backend without a server).

        The hook a backend that talks to a server overrides (its ``export_deadline`` setting).
        """
        return None

    def server_url(self) -> str | None:
        """The server this backend talks to (``http(s)://host:port``), if any: while a send runs
        under its deadline, every connection to it belongs to the send (see ``watchdog``)."""
        return None

    def _abandon(self) -> None:
        """Stop what still sends for an export the deadline abandoned, beyond this process's own
        sockets (which the watchdog shuts down itself); must return within seconds."""
        return None

    @classmethod
    def receives_comparisons(cls) -> bool:
        """Whether this backend has a place for a comparison (implements ``_export_comparison``)."""
        return cls._export_comparison is not PostRunHooks._export_comparison

    def export(self, run: RunArtifacts, plan: ExportPlan) -> ExportResult:
        """Send the run (``_export``) into a new backend run under the backend's deadline; an
        expected failure is a FAILED result naming its cause. Whether a live run of the same eval
        is completed instead is the export engine's decision (``export.certify.export_live``),
        never this method's."""
        return send_watched(self, lambda: self._export(run, plan), run.source, plan.secrets, "export")

    def export_comparison(self, comparison: ComparisonPayload) -> ExportResult:
        """Send a comparison (``_export_comparison``) as ``export`` sends a run: under the
        backend's deadline, an expected failure a FAILED result naming its cause."""
        return send_watched(
            self, lambda: self._export_comparison(comparison), comparison.name, comparison.secrets, "compare"
        )


def send_watched(
    exporter: Exporter, do_send: Callable[[], Sent], what: str, secrets: frozenset[str], kind: str
) -> ExportResult:
    """Run one send of ``exporter`` (``do_send``) under its deadline (``export_deadline_s``, the
    watchdog abandoning it past that), an exception of its ``expected_errors()`` a FAILED result
    naming the cause (secrets redacted); anything else propagates (a bug)."""
    from gym_artifacts.core.watchdog import run_watched

    start = time.monotonic()
    deadline = exporter.export_deadline_s()
    name = exporter.name
    try:
        if deadline is None:
            sent = do_send()
        else:
            server = exporter.server_url()
            abandon = exporter._abandon
            sent = run_watched(do_send, deadline, f"{name}-{kind}", on_abandon=abandon, server=server)
    except exporter.expected_errors() as exc:
        reason = redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0], secrets)
        logger.warning("%s of %s to %s failed: %s", kind, what, name, reason)
        return ExportResult(name, ExportStatus.FAILED, reason=reason, seconds=time.monotonic() - start)
    return ExportResult(
        name,
        ExportStatus.EXPORTED,
        backend_run_id=sent.backend_run_id,
        reason=sent.note,
        rows=sent.rows,
        bytes=sent.bytes,
        seconds=time.monotonic() - start,
    )
