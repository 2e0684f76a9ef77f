"""The run's headline: one line a person reads first (MLflow's run description, W&B's notes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_artifacts.plugin import metric_value

if TYPE_CHECKING:
    from gym_artifacts.plugin import RunPayload


def _mean_rewards(payload: RunPayload) -> list[tuple[str, float]]:
    out = []
    for entry in payload.aggregate_entries or []:
        if not isinstance(entry, dict):
            continue
        metrics = entry.get("agent_metrics")
        value = metrics.get("mean/reward") if isinstance(metrics, dict) else None
        agent = entry.get("agent_ref")
        name = agent.get("name") if isinstance(agent, dict) else None
        number = metric_value(value) if not isinstance(value, bool) else None
        if number is not None:
            out.append((str(name or "agent"), number))
    return out


def headline(payload: RunPayload) -> str:
    """One line: mean reward (per agent when several), coverage and failures."""
    parts = []
    rewards = _mean_rewards(payload)
    if len(rewards) == 1:
        parts.append(f"mean reward {rewards[0][1]:.3g}")
    elif rewards:
        parts.append("mean reward " + ", ".join(f"{a} {v:.3g}" for a, v in rewards))
    coverage = payload.coverage
    if coverage is not None:
        parts.append(coverage.text())
    return " · ".join(parts) or "no aggregate metrics or coverage"
