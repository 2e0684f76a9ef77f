"""What a run's rollouts tell of it (its params, its time window), from the export's one read.

The read that computes the rollouts' identity (``identity.send_key`` through ``jsonl_pass``) also
tallies agent, environment, model and repeats and the rollouts' earliest start and latest end,
and records them in the identity cache under the file's stat key (and in this process's memory,
for a file too new for the cache): asked for them of the file as it is now, nothing is read
again. Without such a record each is read from the file, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from gym_artifacts.run.artifacts import ROLLOUTS, RunArtifacts
from gym_artifacts.run.identity import IdentityCache, stat_key
from gym_artifacts.run.jsonl_pass import (
    FACTS_ENTRY,
    ReadProducts,
    RowValues,
    forget_products,
    remembered_facts,
    remembered_products,
)
from gym_artifacts.run.nemo_gym_params import params_from_files
from gym_artifacts.run.rollouts_table import RolloutsTable


def cached_facts(run: RunArtifacts) -> dict[str, Any] | None:
    """``{"params": ..., "window": [start, end] | None}`` when the one read of the run's rollouts
    recorded them for the file as it is now (in this process, or in the identity cache)."""
    fpath = run.rollouts_fpath
    if fpath is None:
        return None
    try:
        key = stat_key(os.stat(fpath))
    except OSError:
        return None
    facts = remembered_facts(fpath, key)
    if facts is None:
        found, facts = IdentityCache(run.identity_cache_fpath).lookup_product(FACTS_ENTRY + ROLLOUTS, key)
        facts = facts if found else None
    return facts if isinstance(facts, dict) else None


def run_params(run: RunArtifacts) -> dict[str, Any] | None:
    """The params the run's rollouts tell: from their one read when it recorded them, else read."""
    facts = cached_facts(run)
    if facts is None:
        return params_from_files(run)
    params = facts.get("params")
    return params if isinstance(params, dict) else None


def cached_window(run: RunArtifacts) -> tuple[bool, tuple[float, float] | None]:
    """``(True, (start, end) or None)`` when the one read recorded the rollouts' time window for
    the file as it is now, else ``(False, None)``."""
    facts = cached_facts(run)
    if facts is None:
        return False, None
    window = facts.get("window")
    if isinstance(window, list) and len(window) == 2 and all(isinstance(t, int | float) for t in window):
        return True, (float(window[0]), float(window[1]))
    return True, None


def rollout_row_values(run: RunArtifacts) -> RowValues | None:
    """Each rollout's numbers and end time (``rollout_values.row_values``), in line order, when
    this process's one read of the rollouts gave them for the file as it is now (an export to a
    backend that asks for them: ``Exporter.reads_row_values``); else None (read the records)."""
    products = _products(run)
    return products.rows if products is not None else None


def rollouts_table(run: RunArtifacts) -> RolloutsTable | None:
    """NeMo Gym's table of the rollouts (``rollouts_table.TABLE_FILE``), when this process's one
    read of them wrote it for the file as it is now (an export to a backend that ships it:
    ``ships_rollouts_table``); else None (make it from the file)."""
    products = _products(run)
    return products.table if products is not None else None


def _products(run: RunArtifacts) -> ReadProducts | None:
    fpath = run.rollouts_fpath
    if fpath is None:
        return None
    try:
        return remembered_products(fpath, stat_key(os.stat(fpath)))
    except OSError:
        return None


@contextlib.contextmanager
def row_values_of_export(run: RunArtifacts) -> Iterator[None]:
    """The span of an export's sends: what its one read of the run's rollouts made for its
    backends (rows' values, NeMo Gym's table) is let go at its end."""
    try:
        yield
    finally:
        if run.rollouts_fpath is not None:
            forget_products(run.rollouts_fpath)
