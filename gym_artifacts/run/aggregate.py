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

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.flatten import Scalar, flatten
from gym_artifacts.run.artifacts import agent_label

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.coverage import Coverage

LEVEL_INDEX = {"group_level_metrics": "_ng_task_index", "repeat_level_metrics": "_ng_rollout_index"}
_PREFIXED = {"key_metrics": "key_metrics", "perf_summary": "perf_summary"}
_ENTRY_SKIP = {"agent_ref", "agent_metrics", "aggregation_error", *_PREFIXED, *LEVEL_INDEX}


def agent_labels(entries: list[dict[str, Any]]) -> list[str]:
    """Each entry's agent name; a repeated name gets ``#2``, ``#3``... so none is overwritten."""
    seen: dict[str, int] = {}
    labels = []
    for entry in entries:
        label = agent_label(entry.get("agent_ref"))
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return labels


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


@dataclass(frozen=True)
class LevelTable:
    """One per-task or per-repeat level of every agent, as rows labelled by their own index."""

    name: str
    index: str
    columns: list[str]
    rows: list[list[Scalar]]

    def records(self) -> list[dict[str, Scalar]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _row(label: str, index_key: str, item: Any) -> dict[str, Scalar]:
    row: dict[str, Scalar] = {"agent": label}
    if not isinstance(item, dict):
        row[index_key] = None
        row["value"] = json.dumps(item, default=str)
        return row
    index = item.get(index_key)
    row[index_key] = index if isinstance(index, int) and not isinstance(index, bool) else None
    for key, value in item.items():
        if key == index_key:
            continue
        if isinstance(value, dict | list):  # rollout_infos, sample: kept whole, as JSON text
            row[key] = json.dumps(value, default=str, separators=(",", ":"))
        else:
            row[key] = value
    return row


def level_tables(entries: list[dict[str, Any]]) -> list[LevelTable]:
    """The group and repeat levels of every agent that has them, one table per level."""
    tables = []
    for level, index_key in LEVEL_INDEX.items():
        rows: list[dict[str, Scalar]] = []
        for label, entry in zip(agent_labels(entries), entries, strict=True):
            items = entry.get(level)
            if isinstance(items, dict):  # a pre-0.7 shape: one object, not a list per index
                items = [items]
            if isinstance(items, list):
                rows.extend(_row(label, index_key, item) for item in items)
        if not rows:
            continue
        columns = list(dict.fromkeys(k for row in rows for k in row))
        tables.append(LevelTable(level, index_key, columns, [[r.get(c) for c in columns] for r in rows]))
    return tables


def table_jsonl(table: LevelTable) -> bytes:
    """A table as JSON lines, one object per row (the local backend's form)."""
    from gym_artifacts.core.jsonio import canonical_json, json_safe

    return b"".join(canonical_json(json_safe(r)) + b"\n" for r in table.records())


def table_split_json(table: LevelTable) -> bytes:
    """A table in pandas' ``split`` layout without index, which MLflow's UI shows as a table."""
    from gym_artifacts.core.jsonio import canonical_json, json_safe

    return canonical_json(json_safe({"columns": table.columns, "data": table.rows}))


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
    entries = None
    if run.has_rollouts_file and run.aggregate_metrics_fpath.is_file():
        entries = run.read_aggregate_metrics()
    return values_and_tables(entries, coverage, run.omitted_rows())

