"""Everything a backend needs, in one import: the contract, the base classes and the helpers.

A third-party backend imports from here only (``docs/plugins.md``); the names below are kept
stable for plugins, while the rest of the core may move.
"""

from __future__ import annotations

from gym_artifacts.aggregate import LevelTable, aggregate_metrics, level_tables, run_values
from gym_artifacts.atomic import atomic_write_bytes, atomic_write_json
from gym_artifacts.backend import CannotCertify, ExportPlan, RunStatus, Sent
from gym_artifacts.config import ExporterConfig
from gym_artifacts.errors import GymArtifactsError
from gym_artifacts.exporter import Exporter
from gym_artifacts.journal import iter_journal
from gym_artifacts.jsonio import canonical_json, count_lines, iter_jsonl, json_safe
from gym_artifacts.live_exporter import LiveExporter
from gym_artifacts.payload import masked_artifact
from gym_artifacts.run import RunArtifacts
from gym_artifacts.run_payload import PayloadArtifact, RunPayload
from gym_artifacts.secrets import mask_secrets
from gym_artifacts.spool import RolloutSpool
from gym_artifacts.worker import PartialBatch

__all__ = [
    "CannotCertify",
    "ExportPlan",
    "Exporter",
    "ExporterConfig",
    "GymArtifactsError",
    "LevelTable",
    "LiveExporter",
    "PartialBatch",
    "PayloadArtifact",
    "RolloutSpool",
    "RunArtifacts",
    "RunPayload",
    "RunStatus",
    "Sent",
    "aggregate_metrics",
    "atomic_write_bytes",
    "atomic_write_json",
    "canonical_json",
    "count_lines",
    "iter_journal",
    "iter_jsonl",
    "json_safe",
    "level_tables",
    "mask_secrets",
    "masked_artifact",
    "run_values",
]
