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


REPORT_SUFFIX = "_report.html"
LIVE_LOCK_SUFFIX = "_live.lock"
# A journal an earlier live run left is set aside as ``OUT_metrics.jsonl.replaced-<time>-<pid>``.
SET_ASIDE_SUFFIX = ".replaced-20260101T000000-4194304"
_OWN_SUFFIXES = (
    ROLLOUTS_SUFFIX, AGGREGATE_SUFFIX, CONFIG_SUFFIX, ACCEPTANCE_SUFFIX, JOURNAL_SUFFIX, ARTIFACTS_SUFFIX,
    "_failures.jsonl", "_materialized_inputs.jsonl", REPORT_SUFFIX, LIVE_LOCK_SUFFIX,
)  # fmt: skip


def run_file_names(stem: str, exporters: list[str] | tuple[str, ...], *, live: bool = False) -> list[str]:
    """Every name a run ``stem`` may need beside it, for these exporters (and, ``live``, the
    journal set aside by a new live run): computed before the first write so that a stem too
    long for one of them is refused whole, up front."""
    names = [stem + suffix for suffix in _OWN_SUFFIXES] + [identity_cache_name(stem)]
    if live:
        names.append(stem + JOURNAL_SUFFIX + SET_ASIDE_SUFFIX)
    for exporter in exporters:
        names += [receipt_name(stem, exporter), lock_name(stem, exporter), marker_name(stem, exporter)]
    return names


# -- runtime artifacts, inside OUT_artifacts/ ------------------------------------------------------
SESSION_START = "session_start.json"
SESSION_TIMES = "session_times.json"
NVML_SUMMARY = "metrics_summary.json"
NVML_SERIES = "nvml_samples.jsonl"
DERIVED_CONFIG = "derived_config.json"  # what a runtime session (reactor-runtime too) saves
RECORDING = "recording.mp4"
PROFILER_TRACE = "profile.pt.trace.json.gz"
MANIFEST = "manifest.json"
