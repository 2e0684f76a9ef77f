"""Every file name of a run, in one place.

A run is named by its rollouts file ``OUT.jsonl``; everything else sits beside it:

    OUT.jsonl                        rollouts (the eval writes them)
    OUT_aggregate_metrics.json       aggregate metrics (the eval writes them last)
    OUT_config.yaml                  the eval's saved config
    OUT_acceptance.json              a recovery gate's acceptance of a partial stage
    OUT_metrics.jsonl                the live metrics journal
    OUT_artifacts/                   runtime artifacts (names below)
    OUT_<exporter>_export_done.json  a post-run export's receipt
    OUT_<exporter>_export.lock       held while one process exports to that exporter
    OUT_<exporter>_run_id            the live run's marker
    .OUT.gymart-identities.json      the identity stat cache (hidden; never part of the run)
"""

from __future__ import annotations

ROLLOUTS_SUFFIX = ".jsonl"
AGGREGATE_SUFFIX = "_aggregate_metrics.json"
CONFIG_SUFFIX = "_config.yaml"
ACCEPTANCE_SUFFIX = "_acceptance.json"
JOURNAL_SUFFIX = "_metrics.jsonl"
ARTIFACTS_SUFFIX = "_artifacts"
RECEIPT_SUFFIX = "_export_done.json"
LOCK_SUFFIX = "_export.lock"
MARKER_SUFFIX = "_run_id"


def receipt_name(stem: str, exporter: str) -> str:
    return f"{stem}_{exporter}{RECEIPT_SUFFIX}"


def lock_name(stem: str, exporter: str) -> str:
    return f"{stem}_{exporter}{LOCK_SUFFIX}"


def marker_name(stem: str, exporter: str) -> str:
    return f"{stem}_{exporter}{MARKER_SUFFIX}"


def identity_cache_name(stem: str) -> str:
    return f".{stem}.gymart-identities.json"


# -- runtime artifacts, inside OUT_artifacts/ ------------------------------------------------------
SESSION_START = "session_start.json"
SESSION_TIMES = "session_times.json"
NVML_SUMMARY = "metrics_summary.json"
NVML_SERIES = "nvml_samples.jsonl"
DERIVED_CONFIG = "derived_config.json"  # what a runtime session (reactor-runtime too) saves
RECORDING = "recording.mp4"
PROFILER_TRACE = "profile.pt.trace.json.gz"
MANIFEST = "manifest.json"
