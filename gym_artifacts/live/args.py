"""Checking what an eval hands to the live calls, cheaply, at call time.

The live calls promise never to raise into the eval. A call whose arguments cannot be journaled
or logged (``export_metrics(None)``, ``step="x"``) is refused here: counted, its reason kept, and
reported at teardown. Arguments that only look different are normalised (``step=4.0`` and
``step="5"`` become the integers 4 and 5) so that the journal stays exportable. Values under a
metric name that says it is a secret (``api_key``) are masked before they are journaled.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from gym_artifacts.core.secrets import mask_secret_named


class RefusedCall(ValueError):
    """A live call whose arguments cannot be journaled; the message says why."""


STEP_LIMIT = 1 << 63  # steps are int64 in MLflow, W&B and TensorBoard


def normalize_step(step: Any) -> int:
    """``step`` as an int in [0, 2**63): ints, integral floats, numpy integers, decimal strings."""
    if type(step) is int and 0 <= step < STEP_LIMIT:  # the fast path
        return step
    if isinstance(step, bool):
        raise RefusedCall(f"step {step!r} is a bool, not an integer")
    value: Any = step
    if isinstance(step, str):
        try:
            value = int(step.strip())
        except ValueError:
            raise RefusedCall(f"step {step[:40]!r} is not an integer") from None
    elif isinstance(step, float):
        if not step.is_integer():
            raise RefusedCall(f"step {step!r} is not a whole number")
        value = int(step)
    else:
        try:
            value = operator.index(step)  # numpy and other integer types
        except TypeError:
            raise RefusedCall(f"step of type {type(step).__name__} is not an integer") from None
    if value < 0 or value >= STEP_LIMIT:
        raise RefusedCall(f"step {value} is out of range")
    return int(value)


def checked_metrics(metrics: Any) -> Mapping[Any, Any]:
    """The metrics (a masked copy when a name is secret-like); RefusedCall when not a mapping."""
    if not isinstance(metrics, Mapping):
        raise RefusedCall(f"metrics must be a mapping of name to value, not {type(metrics).__name__}")
    return mask_secret_named(metrics)


def rollouts_batch(rollouts: Any) -> list[Any]:
    """The rollouts as a list; RefusedCall for None, a string, a mapping or a non-iterable."""
    if isinstance(rollouts, list):
        return list(rollouts)
    if rollouts is None or isinstance(rollouts, str | bytes | Mapping) or not isinstance(rollouts, Iterable):
        raise RefusedCall(f"rollouts must be a list of records, not {type(rollouts).__name__}")
    return list(rollouts)


class RefusedCalls:
    """How many live calls were refused, and the last reason (reported at teardown)."""

    def __init__(self) -> None:
        self.count = 0
        self.last_reason: str | None = None

    def add(self, call: str, exc: Exception) -> None:
        self.count += 1
        self.last_reason = f"{call}: {exc}"

    def describe(self) -> str:
        return f"{self.count} live call(s) refused (last: {self.last_reason})"

    def __repr__(self) -> str:
        if not self.count:
            return "RefusedCalls(0 refused)"
        return f"RefusedCalls({self.count} refused, last: {self.last_reason})"
