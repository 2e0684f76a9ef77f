"""NeMo Gym's aggregate metrics as trackers receive them: bounded values and per-level tables.

Tracker values use the names NeMo Gym 0.7's own MLflow exporter logs, so dashboards keep
working when a team switches (one entry per agent in ``OUT_aggregate_metrics.json``):

==========================================  ============================================
aggregate file                              tracker name
==========================================  ============================================
``agent_metrics[<stat>]``                   ``<agent>/<stat>`` (e.g. ``<agent>/mean/reward``)
``key_metrics[<key>]``                      ``key_metrics/<agent>/<key>``
``perf_summary[<key>]``                     ``perf_summary/<agent>/<key>``
``_ng_environment_server`` (and any other   ``<agent>/_ng_environment_server`` (text: a tag)
entry-level scalar)
``group_level_metrics`` (one per task)      table ``group_level_metrics``, a row per task
                                            labelled by ``agent`` and ``_ng_task_index``
``repeat_level_metrics`` (one per repeat)   table ``repeat_level_metrics``, a row per
                                            repeat labelled by ``agent`` and
                                            ``_ng_rollout_index``
==========================================  ============================================

So the number of tracker values is O(agents x statistics) whatever the number of tasks: the
per-task and per-repeat levels (and their ``rollout_infos``) go out as tables, never as
metrics or tags, and an index is a row label, never a metric value nor taken from the row's
position in the list. Lists inside ``agent_metrics``/``key_metrics`` are left to the aggregate
file (uploaded whole) for the same reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_artifacts.core.flatten import Scalar, flatten
from gym_artifacts.run.levels import (
    LEVEL_INDEX,
    LevelTable,
    agent_labels,
    level_tables,
    row_of,
    table_jsonl,
    table_split_json,
    write_table_jsonl,
    write_table_split_json,
)

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.coverage import Coverage

_PREFIXED = {"key_metrics": "key_metrics", "perf_summary": "perf_summary"}
_ENTRY_SKIP = {"agent_ref", "agent_metrics", "aggregation_error", *_PREFIXED, *LEVEL_INDEX}


def _bounded(values: Any, prefix: str) -> dict[str, Scalar]:
    """Scalar leaves of nested dicts; a list is a per-item structure and not a tracker value."""
    if not isinstance(values, dict):
        return {}
    return {k: v for k, v in flatten(values, prefix).items() if "[" not in k[len(prefix) :]}


def tracker_values(entries: list[dict[str, Any]]) -> dict[str, Scalar]:
    """The aggregate's bounded values under NeMo Gym's exporter's names (see the module doc)."""
    out: dict[str, Scalar] = {}
    for label, entry in zip(agent_labels(entries), entries, strict=True):
        out.update(_bounded(entry.get("agent_metrics"), label))
        for level, name in _PREFIXED.items():
            out.update(_bounded(entry.get(level), f"{name}/{label}"))
        for key, value in entry.items():
            if key not in _ENTRY_SKIP and isinstance(value, str | int | float | bool):
                out[f"{label}/{key}"] = value
    return out


def aggregate_metrics(entries: list[dict[str, Any]]) -> dict[str, Scalar]:
    """The plugin surface's name for ``tracker_values`` (kept stable for third-party backends)."""
    return tracker_values(entries)


def values_and_tables(
    entries: list[dict[str, Any]] | None, coverage: Coverage | None, omitted_rows: int
) -> tuple[dict[str, Scalar], list[LevelTable]]:
    """Bounded values and per-level tables of aggregate ``entries`` (None: the run has none)."""
    values: dict[str, Scalar] = {}
    tables: list[LevelTable] = []
    if entries is not None:
        values.update(tracker_values(entries))
        tables = level_tables(entries)
    if coverage is not None:
        values.update(coverage.metrics())
    values["omitted_rows"] = omitted_rows
    return values, tables


def run_values(run: RunArtifacts, coverage: Coverage | None) -> tuple[dict[str, Scalar], list[LevelTable]]:
    """What every backend logs from a finished run: bounded values (aggregate under NeMo Gym's
    names, ``coverage/*``, ``omitted_rows``) and the per-level tables."""
    if not (run.has_rollouts_file and run.aggregate_metrics_fpath.is_file()):
        return values_and_tables(None, coverage, run.omitted_rows())
    read = run.read_aggregate()
    values, _ = values_and_tables(read.heads, coverage, run.omitted_rows())
    return values, read.tables


__all__ = [
    "LEVEL_INDEX",
    "LevelTable",
    "agent_labels",
    "aggregate_metrics",
    "level_tables",
    "row_of",
    "run_values",
    "table_jsonl",
    "table_split_json",
    "tracker_values",
    "values_and_tables",
    "write_table_jsonl",
    "write_table_split_json",
]
