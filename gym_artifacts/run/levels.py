"""NeMo Gym's per-task and per-repeat levels as tables: one row per level item, labelled by its
agent and its own index (``group_level_metrics`` by ``_ng_task_index``, ``repeat_level_metrics``
by ``_ng_rollout_index``), and the two forms backends write them in (JSON lines, pandas'
``split`` layout), a row at a time.

Below ``artifacts`` and ``aggregate_read``: it reads no file itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gym_artifacts.core.flatten import Scalar

LEVEL_INDEX = {"group_level_metrics": "_ng_task_index", "repeat_level_metrics": "_ng_rollout_index"}


def agent_label(agent_ref: Any) -> str:
    """A readable name for an ``agent_ref`` (a name string or ``{"name": ...}``)."""
    if isinstance(agent_ref, dict):
        name = agent_ref.get("name")
        if isinstance(name, str) and name:
            return name
    if isinstance(agent_ref, str) and agent_ref:
        return agent_ref
    return "agent"


def agent_labels(entries: list[dict[str, Any]]) -> list[str]:
    """Each entry's agent name; a repeated name gets ``#2``, ``#3``... so none is overwritten."""
    seen: dict[str, int] = {}
    labels = []
    for entry in entries:
        label = agent_label(entry.get("agent_ref"))
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return labels


@dataclass(frozen=True)
class LevelTable:
    """One per-task or per-repeat level of every agent, as rows labelled by their own index.

    ``rows`` is a list, or, for a table read from a large aggregate file, a sequence whose rows
    are read from disk on each iteration (``aggregate_read.SpooledRows``): iterate it (or use
    ``iter_records``, ``write_table_jsonl``) rather than indexing or copying it whole.
    """

    name: str
    index: str
    columns: list[str]
    rows: Sequence[list[Scalar]]

    def iter_records(self) -> Iterator[dict[str, Scalar]]:
        """Each row as ``{column: value}``, one at a time."""
        for row in self.rows:
            yield dict(zip(self.columns, row, strict=True))

    def records(self) -> list[dict[str, Scalar]]:
        """Every row as ``{column: value}`` (all in memory: prefer ``iter_records``)."""
        return list(self.iter_records())


def row_of(label: str, index_key: str, item: Any) -> dict[str, Scalar]:
    """One level item as a table row: agent, index, then its fields (nested ones as JSON text)."""
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
                rows.extend(row_of(label, index_key, item) for item in items)
        if not rows:
            continue
        columns = list(dict.fromkeys(k for row in rows for k in row))
        tables.append(LevelTable(level, index_key, columns, [[r.get(c) for c in columns] for r in rows]))
    return tables


def write_table_jsonl(table: LevelTable, write: Callable[[bytes], object]) -> int:
    """Write a table as JSON lines, one object per row (the local backend's form), a row at a
    time; returns the bytes written."""
    from gym_artifacts.core.jsonio import canonical_json, json_safe

    size = 0
    for record in table.iter_records():
        line = canonical_json(json_safe(record)) + b"\n"
        write(line)
        size += len(line)
    return size


def write_table_split_json(table: LevelTable, write: Callable[[bytes], object]) -> int:
    """Write a table in pandas' ``split`` layout without index, which MLflow's UI shows as a
    table, a row at a time: the bytes of ``canonical_json({"columns": ..., "data": rows})``."""
    from gym_artifacts.core.jsonio import canonical_json, json_safe

    head = b'{"columns":' + canonical_json(json_safe(table.columns)) + b',"data":['
    write(head)
    size = len(head)
    for i, row in enumerate(table.rows):
        cell = (b"," if i else b"") + canonical_json(json_safe(row))
        write(cell)
        size += len(cell)
    write(b"]}")
    return size + 2


def table_jsonl(table: LevelTable) -> bytes:
    """``write_table_jsonl`` gathered in memory."""
    parts: list[bytes] = []
    write_table_jsonl(table, parts.append)
    return b"".join(parts)


def table_split_json(table: LevelTable) -> bytes:
    """``write_table_split_json`` gathered in memory."""
    parts: list[bytes] = []
    write_table_split_json(table, parts.append)
    return b"".join(parts)
