"""Rollouts in the shapes NeMo Gym's own exporters log them, beside this project's richer forms.

NeMo Gym logs each rollout as one JSON document in a one-column table: column ``Rollout``, a
W&B table under the key ``Rollouts`` and an MLflow table artifact ``rollouts.json`` (pandas'
``split`` layout, what ``mlflow.log_table`` writes and ``mlflow.load_table`` reads). Dashboards
and scripts built on those keep working after the import swap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gym_artifacts.plugin import ROLLOUT_COLUMN as ROLLOUT_COLUMN  # the table's one column
from gym_artifacts.plugin import TABLE_FILE as MLFLOW_TABLE_FILE  # noqa: F401 (mlflow.py imports it from here)
from gym_artifacts.plugin import SplitTable, mask_values, redact_text

WANDB_TABLE_KEY = "Rollouts"


def rollout_documents(rollouts: Iterable[Any], secrets: frozenset[str] = frozenset()) -> Iterator[str]:
    """Each rollout as one compact JSON document (NeMo Gym: ``orjson.dumps(rollout)``), the
    config's secrets masked on its decoded values."""
    for rollout in rollouts:
        value = mask_values(rollout, secrets) if secrets else rollout
        yield json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def file_documents(fpath: Path, secrets: frozenset[str] = frozenset()) -> Iterator[str]:
    """The JSON documents of a JSONL file's complete lines (as written, blank lines skipped);
    with ``secrets``, each is decoded, masked and written again compactly (a table is made from
    the rollouts, not the file shipped as written: it never carries a secret)."""
    with open(fpath, encoding="utf-8") as fh:
        for line in fh:
            if line.endswith("\n") and line.strip():
                yield _masked_document(line.strip(), secrets) if secrets else line.strip()


def _masked_document(doc: str, secrets: frozenset[str]) -> str:
    try:
        value = json.loads(doc)
    except ValueError:  # not JSON: masked as text
        return redact_text(doc, secrets)
    return json.dumps(mask_values(value, secrets), ensure_ascii=False, separators=(",", ":"), default=str)


def write_split_table(documents: Iterable[str], dest: Path) -> int:
    """Stream ``documents`` into ``dest`` as a one-column table in pandas' split layout; returns
    the row count (memory stays flat in the number of rows)."""
    with open(dest, "wb") as fh:
        table = SplitTable(fh)
        for doc in documents:
            table.add(doc)
        table.end()
    return table.rows
