"""Everything a backend needs, in one import: the contract, the base classes and the helpers.

A backend, built in (``exporters/``) or installed, imports from here only (``docs/plugins.md``);
``lint-imports`` holds the built-in ones to it (``pyproject.toml``, ``[tool.importlinter]``). The
names below are kept stable for plugins, while the rest of the core may move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_artifacts.contract.comparison import ComparisonPayload
from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import CannotCertify, ExportPlan, PartialBatch, RunStatus, Sent
from gym_artifacts.contract.live_exporter import LiveExporter, LiveTracing
from gym_artifacts.contract.live_traces import LiveTraces
from gym_artifacts.contract.run_payload import PayloadArtifact, RunPayload
from gym_artifacts.core.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_writer,
    open_regular,
    sync_barrier,
)
from gym_artifacts.core.config import ExporterConfig, ReportWhen
from gym_artifacts.core.destination import (
    absolute_store_uri,
    credential_free_uri,
    dataset_service_destination,
    resolved_path,
)
from gym_artifacts.core.errors import ConfigError, GymArtifactsError
from gym_artifacts.core.flatten import flatten
from gym_artifacts.core.jsonio import (
    canonical_json,
    count_lines,
    escaped_text,
    iter_jsonl,
    json_safe,
    metric_value,
    read_json,
)
from gym_artifacts.core.locking import exclusive_lock, shared_lock_fpath
from gym_artifacts.core.secrets import mask_secrets, mask_values, redact_text
from gym_artifacts.core.snapshot import snapshot_copy
from gym_artifacts.core.watchdog import adopted, current_watch, made_progress

# The contract and base classes, then what a backend reads from a run, where its settings point
# (destinations), and how it keeps secrets out of what it sends. Nothing here imports an SDK.
from gym_artifacts.run.aggregate import LevelTable, write_table_jsonl, write_table_split_json
from gym_artifacts.run.artifacts import RunArtifacts, agent_label
from gym_artifacts.run.journal import journal_line, repair_partial_last_line
from gym_artifacts.run.layout import NVML_SERIES, NVML_SUMMARY, RECORDING
from gym_artifacts.run.names import saved_config_run_name
from gym_artifacts.run.receipts import utc_now_iso
from gym_artifacts.run.responses_api import last_user_message, response_text
from gym_artifacts.run.rollout_spans import (
    AGENT,
    LLM,
    TOOL,
    RolloutTrace,
    Span,
    failure_trace,
    rollout_trace,
    trace_id_for,
)
from gym_artifacts.run.rollout_values import (
    REQUEST_KEYS,
    RESPONSE_KEYS,
    rollout_numbers,
    token_counts,
)
from gym_artifacts.run.rollouts_facts import rollout_row_values
from gym_artifacts.run.rollouts_table import ROLLOUT_COLUMN, TABLE_FILE, SplitTable
from gym_artifacts.run.spool import RolloutSpool
from gym_artifacts.run.times import eval_end_s, eval_times, run_times
from gym_artifacts.run.trajectory import (
    Trajectory,
    failed_trajectory,
    failures_with_plans,
    rollout_key,
    rollout_window,
    trajectory_of,
    verdicts_and_extra,
)

if TYPE_CHECKING:
    from gym_artifacts.report.deferred import ReportJob
    from gym_artifacts.report.deferred import build as build_report_job
    from gym_artifacts.report.deferred import start_background as start_report_in_background

# The report's names, imported on first use: the report (and its charts) is loaded only by a
# backend that writes one, never by importing this module. Name -> (module, attribute).
_LAZY = {
    "ReportJob": ("gym_artifacts.report.deferred", "ReportJob"),
    "build_report_job": ("gym_artifacts.report.deferred", "build"),
    "start_report_in_background": ("gym_artifacts.report.deferred", "start_background"),
}


def __getattr__(name: str) -> Any:
    """The report's names (``_LAZY``) on first use."""
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AGENT",
    "LLM",
    "NVML_SERIES",
    "NVML_SUMMARY",
    "RECORDING",
    "REQUEST_KEYS",
    "RESPONSE_KEYS",
    "ROLLOUT_COLUMN",
    "TABLE_FILE",
    "TOOL",
    "CannotCertify",
    "ComparisonPayload",
    "ConfigError",
    "ExportPlan",
    "Exporter",
    "ExporterConfig",
    "GymArtifactsError",
    "LevelTable",
    "LiveExporter",
    "LiveTraces",
    "LiveTracing",
    "PartialBatch",
    "PayloadArtifact",
    "ReportJob",
    "ReportWhen",
    "RolloutSpool",
    "RolloutTrace",
    "RunArtifacts",
    "RunPayload",
    "RunStatus",
    "Sent",
    "Span",
    "SplitTable",
    "Trajectory",
    "absolute_store_uri",
    "adopted",
    "agent_label",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_writer",
    "build_report_job",
    "canonical_json",
    "count_lines",
    "credential_free_uri",
    "current_watch",
    "dataset_service_destination",
    "escaped_text",
    "eval_end_s",
    "eval_times",
    "exclusive_lock",
    "failed_trajectory",
    "failure_trace",
    "failures_with_plans",
    "flatten",
    "iter_jsonl",
    "journal_line",
    "json_safe",
    "last_user_message",
    "made_progress",
    "mask_secrets",
    "mask_values",
    "metric_value",
    "open_regular",
    "read_json",
    "redact_text",
    "repair_partial_last_line",
    "resolved_path",
    "response_text",
    "rollout_key",
    "rollout_numbers",
    "rollout_row_values",
    "rollout_trace",
    "rollout_window",
    "run_times",
    "saved_config_run_name",
    "shared_lock_fpath",
    "snapshot_copy",
    "start_report_in_background",
    "sync_barrier",
    "token_counts",
    "trace_id_for",
    "trajectory_of",
    "utc_now_iso",
    "verdicts_and_extra",
    "write_table_jsonl",
    "write_table_split_json",
]
