"""The post-run Exporter interface: a tiny contract that reports expected failures as results."""

from __future__ import annotations

import enum
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gym_artifacts.config import ExporterConfig, exporter_section, validate_settings
from gym_artifacts.errors import GymArtifactsError
from gym_artifacts.secrets import redact_text

if TYPE_CHECKING:
    from typing_extensions import Self

    from gym_artifacts.run import RunArtifacts

logger = logging.getLogger(__name__)


class ExportStatus(str, enum.Enum):
    """How an export of one run to one backend ended."""

    EXPORTED = "EXPORTED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ExportResult:
    """One run's export to one backend: what happened, where it went, how much was sent."""

    exporter: str
    status: ExportStatus
    backend_run_id: str | None = None
    reason: str | None = None
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def to_json(self, run: str) -> dict[str, Any]:
        """The CLI's ``--json`` object for this result."""
        return {
            "run": run,
            "exporter": self.exporter,
            "status": self.status.value,
            "backend_run_id": self.backend_run_id,
            "reason": self.reason,
            "rows": self.rows,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True)
class ExportPlan:
    """What a send needs beyond the run's paths, computed once for every backend."""

    identities: dict[str, str]
    run_identity: str
    upload_rollouts: bool
    certify: bool = False
    config: dict[str, Any] | None = None
    secrets: frozenset[str] = field(default_factory=frozenset)
    # Records in the rollouts file, when hashing counted them (saves a second read).
    rollout_rows: int | None = None


@dataclass(frozen=True)
class Sent:
    """What a backend's send reports back: the backend run and the amount sent."""

    backend_run_id: str | None
    rows: int = 0
    bytes: int = 0
    note: str | None = None


class Exporter(ABC):
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

    @abstractmethod
    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        """Send everything the run has to the backend; idempotent for the same run identity."""
