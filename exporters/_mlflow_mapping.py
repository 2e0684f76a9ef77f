"""How a run's content maps onto MLflow's names and limits (pure functions, no SDK).

MLflow names may hold letters, digits, ``_ - . / :`` and spaces, at most 250 characters, and
must not look like a path that normalises to another name. Keys are sanitised (``pass@1`` ->
``pass_at_1``, list indexes ``[i]`` -> ``.i``), shortened with a digest when too long, and two
keys that sanitise to the same name are told apart by a numbered suffix: none is dropped.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gym_artifacts.plugin import flatten, metric_value

MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
_INDEX = re.compile(r"\[(\d+)\]")
_INVALID = re.compile(r"[^\w.\- :/]")


def sanitize_key(key: str) -> str:
    """A valid MLflow param/metric/tag name for ``key``."""
    name = _INDEX.sub(r".\1", key).replace("@", "_at_")
    name = _INVALID.sub("_", name)
    parts = [p for p in name.split("/") if p]
    parts = [("_" + p) if p in (".", "..") else p for p in parts]
    name = "/".join(parts) or "_"
    if name.startswith("."):
        name = "_" + name
    if len(name) > MAX_KEY:
        digest = hashlib.blake2s(key.encode(), digest_size=4).hexdigest()
        name = f"{name[: MAX_KEY - 9]}-{digest}"
    return name


def unique_names(keys: Iterable[str]) -> dict[str, str]:
    """``{original: sanitised}`` where no two originals share a sanitised name."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for key in sorted(set(keys)):
        name = sanitize_key(key)
        if name in taken:
            n = 2
            while f"{name[: MAX_KEY - 6]}-{n}" in taken:
                n += 1
            name = f"{name[: MAX_KEY - 6]}-{n}"
        taken.add(name)
        out[key] = name
    return out


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The config flattened to params: dotted keys, list items by index, values as text."""
    flat = flatten(dict(config), sep=".")
    names = unique_names(flat)
    params = {}
    for key, value in flat.items():
        text = value if isinstance(value, str) else json.dumps(value)
        params[names[key]] = _truncate(text, MAX_PARAM_VALUE)
    return params


# Every integer up to this is exact as a float; past it, a float metric may round it.
MAX_EXACT_FLOAT_INT = 2**53


def split_metrics(values: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """Numeric leaves as metrics and text leaves as tags, under sanitised unique names.

    MLflow stores metrics as floats: an integer past float precision (``|n| > 2**53``, e.g.
    ``2**64``) is a metric to plot and also a tag of the same name with its exact digits.
    """
    flat = flatten(dict(values), prefix=prefix)
    names = unique_names(flat)
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    for key, value in flat.items():
        number = metric_value(value)
        if number is not None:
            metrics[names[key]] = number
            if isinstance(value, numbers.Integral) and abs(int(value)) > MAX_EXACT_FLOAT_INT:
                tags[names[key]] = str(int(value))
        elif isinstance(value, str):
            tags[names[key]] = _truncate(value, MAX_TAG_VALUE)
    return metrics, tags


def tag_value(text: str) -> str:
    return _truncate(text, MAX_TAG_VALUE)
