"""Nested values as flat ``{"a/b.0/c": leaf}`` names, the form every tracker takes for params
and metrics (so a name is the same in the local backend, MLflow, W&B and TensorBoard)."""

from __future__ import annotations

import numbers
from typing import Any

Scalar = int | float | bool | str | None




def flatten(value: Any, prefix: str = "", sep: str = "/") -> dict[str, Scalar]:
    """Nested dicts and lists as ``{"a/b.0/c": leaf}``; leaves are kept as they are.

    A list index is written ``.i`` (not ``[i]``), a form every backend accepts as it is, so a
    metric has the same name in the local backend, MLflow, W&B and TensorBoard.
    """
    out: dict[str, Scalar] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if not node and path:
                return
            for key, child in node.items():
                walk(child, f"{path}{sep}{key}" if path else str(key))
        elif isinstance(node, list | tuple):
            for i, child in enumerate(node):
                walk(child, f"{path}.{i}" if path else str(i))
        else:
            out[path] = node

    walk(value, prefix)
    return out


def is_number(value: Any) -> bool:
    """A real number a tracker can plot: ints, floats, bools, numpy scalars; not strings."""
    return isinstance(value, numbers.Real)


