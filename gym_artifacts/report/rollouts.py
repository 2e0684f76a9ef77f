"""The report's rollouts table: what a person reads in a NeMo Gym rollout, one row each.

For Responses API rollouts (``responses_create_params`` / ``response``, as NeMo Gym 0.7 writes
them): task and repeat (``_ng_task_index``, ``_ng_rollout_index``), agent, reward, the last user
message, the response text (from the ``output[]`` message items; ``output_text`` when an older
writer put one), the tool calls, and the failure kind and reason. Failed rollouts routed to the
failures sidecar are rows too (no reward, their failure class and message), so the table shows
every planned rollout that has a result. For other rollouts, the scalar fields are the columns,
chosen from all rows (not the first), plus the start of the line as written.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym_artifacts.core.jsonio import parse_jsonl_line, read_line
from gym_artifacts.run.artifacts import agent_label
from gym_artifacts.run.responses_api import last_user_message, response_text, tool_calls

TEXT_CHARS = 400
PREVIEW_CHARS = 160
MAX_COLUMNS = 5
RESPONSES_COLUMNS = ["task", "repeat", "agent", "prompt", "response", "tool calls", "failure", "reason"]
_HIDDEN = {"reward", "mask_sample"}
SPOOL_IN_MEMORY_BYTES = 8 << 20  # rows beyond this go to a temporary file: memory stays flat


def _cut(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_responses_api(record: Any) -> bool:
    return isinstance(record, dict) and ("responses_create_params" in record or "response" in record)


def _index(record: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def responses_cells(record: dict[str, Any]) -> dict[str, Any]:
    """The Responses API columns of one rollout (or of one failures-sidecar row)."""
    failure = record.get("failure_kind") or record.get("_ng_failure_class") or record.get("_ng_failure_type")
    reason = record.get("failure_reason") or record.get("_ng_failure_message")
    return {
        "task": _index(record, "_ng_task_index", "task_index"),
        "repeat": _index(record, "_ng_rollout_index", "repeat"),
        "agent": agent_label(record.get("agent_ref")) if "agent_ref" in record else None,
        "prompt": _cut(last_user_message(record.get("responses_create_params"))),
        "response": _cut(response_text(record.get("response"))),
        "tool calls": _cut(tool_calls(record.get("response"))),
        "failure": None if failure is None else str(failure),
        "reason": None if reason is None else _cut(str(reason)),
    }


def _scalar_cells(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        return {}
    return {
        k: v
        for k, v in record.items()
        if isinstance(v, str | int | float | bool) and k not in _HIDDEN and not k.startswith("_ng_")
    }


def rollout_lines(fpath: Path, end: int | None = None) -> Iterator[tuple[int, bytes, Any]]:
    """``(line number, raw line, record)`` for every non-blank line starting before ``end``."""
    with open(fpath, "rb") as fh:
        lineno = 0
        while (end is None or fh.tell() < end) and (raw := read_line(fh, fpath, lineno + 1)):
            lineno += 1
            if raw.strip():
                yield lineno, raw, parse_jsonl_line(raw, fpath, lineno, "rollouts JSONL")


def table_cell(value: Any) -> Any:
    """A table cell JSON can carry (no NaN or infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RolloutTable:
    """Rows gathered line by line and spooled (never all held); columns decided once every row
    was seen."""

    def __init__(self) -> None:
        self._spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 - closed by rows()
        self._count = 0
        self.responses_api = False
        self._seen: dict[str, int] = {}
        self._filled: set[str] = set()  # columns with a non-empty value in some row

    def add(self, label: str, reward: Any, record: Any, raw: bytes | None) -> None:
        if is_responses_api(record) or (isinstance(record, dict) and "_ng_failure_class" in record):
            self.responses_api = True
            cells, preview = responses_cells(record), None
        else:
            cells = _scalar_cells(record)
            preview = None if raw is None else raw[: PREVIEW_CHARS * 2].decode("utf-8", "replace")
            preview = None if preview is None else preview.strip()[:PREVIEW_CHARS]
        for key, value in cells.items():
            self._seen[key] = self._seen.get(key, 0) + 1
            if value not in (None, ""):
                self._filled.add(key)
        cells = {k: table_cell(v) for k, v in cells.items()}
        row = json.dumps([label, reward, cells, preview], ensure_ascii=False, allow_nan=False, default=str)
        self._spool.write(row.encode("utf-8") + b"\n")
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def columns(self) -> list[str]:
        if self.responses_api:
            return [c for c in RESPONSES_COLUMNS if c in self._filled]
        # the most common scalar fields across every row, in first-seen order
        common = sorted(self._seen, key=lambda k: -self._seen[k])[:MAX_COLUMNS]
        return [k for k in self._seen if k in common]

    def layout(self) -> tuple[list[str], Iterator[list[Any]]]:
        """Header and rows (read back from the spool once): line, reward, the chosen columns (and
        a preview for plain rows)."""
        columns = self.columns()
        preview = not self.responses_api
        header = ["line", "reward", *columns, *(["rollout (start)"] if preview else [])]
        return header, self._rows(columns, preview)

    def _rows(self, columns: list[str], preview: bool) -> Iterator[list[Any]]:
        spool = self._spool
        try:
            spool.seek(0)
            for line in spool:
                label, reward, cells, start = json.loads(line)
                row = [label, reward, *(cells.get(c) for c in columns)]
                if preview:
                    row.append(start)
                yield row
        finally:
            spool.close()
