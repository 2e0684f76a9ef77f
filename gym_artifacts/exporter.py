"""The Exporter base: builds a backend from its config section and turns expected failures into results.

The hooks and the types a backend deals in are declared in ``gym_artifacts.backend``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

from gym_artifacts.backend import ExportPlan, ExportResult, ExportStatus, PostRunHooks, Sent
from gym_artifacts.config import ExporterConfig, exporter_section, validate_settings
from gym_artifacts.errors import GymArtifactsError
from gym_artifacts.secrets import redact_text

if TYPE_CHECKING:
    from typing_extensions import Self

    from gym_artifacts.run import RunArtifacts

# The result types live in the contract module; importing them from here keeps working.
__all__ = ["ExportPlan", "ExportResult", "ExportStatus", "Exporter", "Sent"]

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

    def __init__(self, settings: ExporterConfig) -> None:
        self.settings = settings

    @classmethod
    def from_global_config(cls, cfg: Any) -> Self:
        """Build from the whole config, validating this backend's section first."""
        section = exporter_section(cfg, cls.name)
        return cls(validate_settings(cls.config_model, section, cls.name))

    def expected_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean the backend refused or is unreachable, not a bug of ours."""
        return (GymArtifactsError, OSError)

    def export(self, run: RunArtifacts, plan: ExportPlan) -> ExportResult:
        """Send the run; an expected failure is a FAILED result naming its cause."""
        start = time.monotonic()
        try:
            sent = self._export(run, plan)
        except self.expected_errors() as exc:
            reason = redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0], plan.secrets)
            logger.warning("export of %s to %s failed: %s", run.source, self.name, reason)
            return ExportResult(
                self.name, ExportStatus.FAILED, reason=reason, seconds=time.monotonic() - start
            )
        return ExportResult(
            self.name,
            ExportStatus.EXPORTED,
            backend_run_id=sent.backend_run_id,
            reason=sent.note,
            rows=sent.rows,
            bytes=sent.bytes,
            seconds=time.monotonic() - start,
        )

