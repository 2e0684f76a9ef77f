"""How a run's content maps onto MLflow's names and limits (pure functions, no SDK).

MLflow names may hold letters, digits, ``_ - . / :`` and spaces, at most 250 characters, and
must not look like a path that normalises to another name. Names are made exactly as NeMo Gym's
own MLflow exporter makes them (``nemo_gym/exporters/mlflow.py``), so a run exported here and a
run NeMo Gym logged itself show the same names: ``@`` -> ``_at_``, any other refused character
-> ``_``, empty path segments dropped, an all-dot segment and leading dots -> as many ``_``, an
over-long name cut in the middle (``___``) keeping both ends; a name with nothing left is
dropped. Config params are flattened as NeMo Gym flattens them (``a.b``, list items ``a[0]``),
values as ``str(value)`` cut at MLflow's limit. Two different keys that still come out as one
name are told apart by a numbered suffix (NeMo Gym would log both under one name).
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gym_artifacts.plugin import escaped_text, flatten, metric_value

MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_PARAM_VALUE = 6000  # MAX_PARAM_VAL_LENGTH
MAX_TAG_VALUE = 8000  # MAX_TAG_VAL_LENGTH
_INVALID = re.compile(r"[^/\w.\- :]")
_LEADING_DOTS = re.compile(r"^\.+")
_ELISION = "___"


def _normalize_path(name: str) -> str:
    """Drop empty path segments; an all-dot segment and leading dots become as many ``_``."""
    segments = [s for s in name.split("/") if s]
    segments = ["_" * len(s) if set(s) == {"."} else s for s in segments]
    return _LEADING_DOTS.sub(lambda m: "_" * len(m.group()), "/".join(segments))


def _elide(name: str, limit: int = MAX_KEY) -> str:
    """An over-long name cut in the middle: the head (benchmark, agent) and the tail (statistic) stay."""
    if len(name) <= limit:
        return name
    kept = limit - len(_ELISION)
    head, tail = kept - kept // 2, kept // 2
    return name[:head] + _ELISION + (name[-tail:] if tail else "")


def sanitize_key(key: str) -> str | None:
    """The MLflow name NeMo Gym's exporter gives ``key``; None when nothing is left of it."""
    name = _normalize_path(_INVALID.sub("_", key.replace("@", "_at_")))
    name = _normalize_path(_elide(name))
    return name or None


def unique_names(keys: Iterable[str]) -> dict[str, str]:
    """``{original: sanitised}`` where no two originals share a sanitised name; a key with
    nothing left once sanitised (``""``, ``"/"``) is left out, as NeMo Gym drops it."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for key in sorted(set(keys)):
        name = sanitize_key(key)
        if name is None:
            continue
        if name in taken:
            n = 2
            while f"{name[: MAX_KEY - 6]}-{n}" in taken:
                n += 1
            name = f"{name[: MAX_KEY - 6]}-{n}"
        taken.add(name)
        out[key] = name
    return out


def _truncate(text: str, limit: int) -> str:
    """``text`` as MLflow stores it: a path's undecodable bytes escaped, cut to ``limit``."""
    text = escaped_text(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_config(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, leaf)`` pairs as NeMo Gym flattens a config: ``a.b``, list items ``a[0]``;
    an empty mapping or list yields nothing."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from flatten_config(inner, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            yield from flatten_config(inner, f"{prefix}[{index}]")
    elif prefix:
        yield prefix, value


def config_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The config as NeMo Gym logs it as params: flattened, names sanitised, ``str(value)`` kept
    whole up to MLflow's limit and cut there (the whole config is also logged as a file)."""
    flat = dict(flatten_config(config))
    names = unique_names(flat)
    return {
        names[key]: escaped_text(str(value))[:MAX_PARAM_VALUE] for key, value in flat.items() if key in names
    }


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
        if key not in names:
            continue
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


HEADLINE_MAX = 12  # metric columns a run brings to MLflow's runs list
METRICS_TABLE = "metrics.json"  # every other statistic, under ``tables/``


def headline_split(numbers: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The run's headline metrics and the rest (its ``tables/metrics.json``).

    MLflow's evaluation-runs list gets a column per metric name, and NeMo Gym's aggregate has
    about 60 statistics an agent. The headline, in this order up to ``HEADLINE_MAX``:
    ``coverage/*``, each agent's mean reward, ``omitted_rows``, then the rest of NeMo Gym's own
    ``key_metrics`` of each agent (under their ``<agent>/<key>`` names, e.g.
    ``<agent>/mean/total_tokens``, as NeMo Gym's own exporter names them). A run with that few
    values keeps them all."""
    if len(numbers) <= HEADLINE_MAX:
        return dict(numbers), {}
    keyed = [k[len("key_metrics/") :] for k in numbers if k.startswith("key_metrics/")]
    keyed = [k if k in numbers else f"key_metrics/{k}" for k in keyed]
    rewards = [k for k in [*keyed, *numbers] if k in ("reward", "mean/reward") or _agent_mean_reward(k)]
    chosen = [k for k in numbers if k.startswith("coverage/")]
    chosen += [*rewards, *(k for k in ("omitted_rows",) if k in numbers), *keyed]
    head = list(dict.fromkeys(chosen))[:HEADLINE_MAX]
    return {k: numbers[k] for k in head}, {k: v for k, v in numbers.items() if k not in head}


def _agent_mean_reward(name: str) -> bool:
    """``<agent>/mean/reward`` (not ``<agent>/<stat>_across_repeats/mean/reward``)."""
    parts = name.split("/")
    return len(parts) == 3 and parts[1:] == ["mean", "reward"]


def metrics_table(rest: Mapping[str, float]) -> bytes:
    """The statistics left out of the headline as an MLflow table (split JSON: metric, value)."""
    return json.dumps({"columns": ["metric", "value"], "data": [[k, v] for k, v in rest.items()]}).encode()

