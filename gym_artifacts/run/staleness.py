"""Whether a run's aggregate metrics still describe its rollouts.

Decided from content where the files allow it: per agent, the number of rollouts and their mean
reward recomputed from the rollouts must equal the aggregate's ``num_rollouts`` (when given)
and ``mean/reward``. Only when the content cannot tell (no agent has a ``mean/reward``, or the
rollouts carry no ``agent_ref`` and ``reward``) do modification times decide, as the seed
contract asks: aggregate metrics older than the rollouts are stale. Content is read only when
the times disagree, so an ordinary run costs one ``stat`` per file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gym_artifacts.core.flags import STALE_OVERRIDE_FLAG
from gym_artifacts.core.jsonio import iter_jsonl

REL_TOLERANCE = 1e-6


def _agent_name(agent_ref: Any) -> str | None:
    if isinstance(agent_ref, dict):
        name = agent_ref.get("name")
        return name if isinstance(name, str) else None
    return agent_ref if isinstance(agent_ref, str) else None


def content_agrees(
    entries: list[dict[str, Any]], rollouts: Path, complete_bytes: int | None = None
) -> bool | None:
    """Whether the aggregate describes the rollouts, or None when the content cannot tell."""
    expected: dict[str, tuple[float, int | None]] = {}
    for entry in entries:
        name = _agent_name(entry.get("agent_ref"))
        metrics = entry.get("agent_metrics")
        if name is None or not isinstance(metrics, dict):
            continue
        mean = metrics.get("mean/reward")
        count = metrics.get("num_rollouts")
        if isinstance(mean, int | float) and not isinstance(mean, bool) and math.isfinite(mean):
            expected[name] = (float(mean), count if isinstance(count, int) else None)
    if not expected:
        return None
    totals: dict[str, list[float]] = {}
    for _, record in iter_jsonl(rollouts, "rollouts JSONL", end=complete_bytes):
        if not isinstance(record, dict):
            return None
        name = _agent_name(record.get("agent_ref"))
        reward = record.get("reward")
        if name is None or not isinstance(reward, int | float) or isinstance(reward, bool):
            return None
        acc = totals.setdefault(name, [0.0, 0])
        acc[0] += float(reward)
        acc[1] += 1
    if set(expected) - set(totals):
        return False
    for name, (mean, count) in expected.items():
        total, n = totals[name]
        if count is not None and count != n:
            return False
        if not math.isclose(total / n, mean, rel_tol=REL_TOLERANCE, abs_tol=1e-9):
            return False
    return True


def stale_reason(
    aggregate: Path, rollouts: Path, entries: list[dict[str, Any]], complete_bytes: int | None = None
) -> str | None:
    """Why the aggregate metrics are stale, or None when they describe the rollouts."""
    if aggregate.stat().st_mtime_ns >= rollouts.stat().st_mtime_ns:
        return None
    agrees = content_agrees(entries, rollouts, complete_bytes)
    if agrees is True:
        return None
    why = (
        "their per-agent rollout counts or mean rewards differ from the rollouts'"
        if agrees is False
        else f"{aggregate.name} is older than the rollouts and the content cannot tell"
    )
    return (
        f"{aggregate}: aggregate metrics are stale ({why}); rerun the aggregation, "
        f"or pass {STALE_OVERRIDE_FLAG} to export them as they are"
    )
