"""A rollout's numbers: its verdicts and token counts, and when it ended (pure functions).

What TensorBoard logs of every row (a scalar each, and the histograms), computed here once so
that the export's one read of the rollouts (``jsonl_pass``) can give them for every row and a
backend need not parse the file again (``rollouts_facts.rollout_row_values``).
"""

from __future__ import annotations

from typing import Any

from gym_artifacts.run.trajectory import rollout_verdicts, rollout_window

REQUEST_KEYS = ("responses_create_params", "request", "input", "prompt")
RESPONSE_KEYS = ("response", "output", "completion")
TOKEN_KEYS = ("input_tokens", "output_tokens", "total_tokens")


def _count(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (a bool, an int past the float range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def token_counts(response: Any) -> dict[str, float]:
    """A Responses API response's ``usage`` token counts (the numeric ones present)."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return {}
    counts = {k: _count(usage.get(k)) for k in TOKEN_KEYS}
    return {k: v for k, v in counts.items() if v is not None}


def _first_key(record: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in record), None)


def rollout_numbers(record: Any) -> list[tuple[str, float]]:
    """A rollout record's histogram values in the order TensorBoard's histograms take them:
    its verdicts (``reward`` first, ``rollout_verdicts``: the one definition), then its
    response's token counts (``token_counts``), without building a rollout view."""
    if not isinstance(record, dict):
        return []
    skip = (_first_key(record, REQUEST_KEYS), _first_key(record, RESPONSE_KEYS), "agent_ref")
    numbers = list(rollout_verdicts(record, [k for k in skip if k is not None]).items())
    response = record["response"] if "response" in record else record.get(_first_key(record, RESPONSE_KEYS))
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        for key in TOKEN_KEYS:
            count = _count(usage[key]) if key in usage else None
            if count is not None:
                numbers.append((key, count))
    return numbers


def row_values(record: Any) -> tuple[list[tuple[str, float]], float | None]:
    """One row's numbers (``rollout_numbers``) and its end time (``rollout_window``; None when
    the line holds no time)."""
    return rollout_numbers(record), rollout_window(record)[1]
