"""The release policy of ``compare --policy FILE``: which metrics decide, how, and known regressions.

A YAML mapping (``docs/compare.md``, "The policy")::

    version: 1
    alpha: 0.05                 # significance level of every metric's test
    min_paired_coverage: 0.9    # share of the larger run's tasks that must pair, else INCONCLUSIVE
    max_input_mismatch: 0.1     # share of common tasks whose inputs may differ (excluded) before
                                # the comparison is refused
    metrics:
      - name: reward
        direction: higher_is_better   # or lower_is_better (tokens, latency, cost)
        margin: 0.02                  # the worsening tolerated, in the metric's units (>= 0)
        alternative: two-sided        # two-sided | greater | less (see gate.py); higher = greater,
                                      # lower = less
        tier: blocking                # blocking (decides FAIL) | tracked (at most WARN)
    waivers:
      - metric: output_tokens         # and/or task: 17
        reason: longer answers expected after the chain-of-thought change
        expires: 2027-01-31           # from that day on the waiver no longer applies

Validated strictly, before any run is read: an unknown key names the closest known one, a
wrong type or value names what is allowed, a date must be a real ``YYYY-MM-DD``. Every problem
is a PolicyError (exit 2) naming the file and the key's place.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gym_artifacts.compare.stats import DEFAULT_ALPHA, MIN_PAIRED_COVERAGE
from gym_artifacts.core.errors import ConfigError
from gym_artifacts.core.suggest import did_you_mean

DIRECTIONS = ("higher_is_better", "lower_is_better")
ALTERNATIVES = ("two-sided", "greater", "less")
# the and NeMo Gym's words for the one-sided alternatives, read as scipy's
ALTERNATIVE_SYNONYMS = {"higher": "greater", "lower": "less"}
TIERS = ("blocking", "tracked")
TOP_KEYS = ("version", "alpha", "min_paired_coverage", "max_input_mismatch", "metrics", "waivers")
METRIC_KEYS = ("name", "direction", "margin", "alternative", "tier")
WAIVER_KEYS = ("task", "metric", "reason", "expires")
DEFAULT_MIN_PAIRED_COVERAGE = MIN_PAIRED_COVERAGE  # NeMo Gym main's rule, as the plain test's
DEFAULT_MAX_INPUT_MISMATCH = 0.5  # above this share, the runs are not runs of the same tasks
MAX_POLICY_BYTES = 1 << 20  # a policy is a page of YAML; past this it is refused, not read whole


class PolicyError(ConfigError):
    """An unusable policy file: the CLI exits with code 2."""


@dataclass(frozen=True)
class MetricRule:
    """How one metric decides: its good direction, the worsening tolerated, the test, the tier."""

    name: str
    direction: str = "higher_is_better"
    margin: float = 0.0
    alternative: str = "two-sided"
    tier: str = "blocking"

    @property
    def lower_is_better(self) -> bool:
        return self.direction == "lower_is_better"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.name, "direction": self.direction, "margin": self.margin,
                "alternative": self.alternative, "tier": self.tier}  # fmt: skip


@dataclass(frozen=True)
class Waiver:
    """A known regression: of a metric, of a task, or of a metric on one task; until ``expires``."""

    reason: str
    expires: dt.date
    task: int | str | None = None
    metric: str | None = None

    def active(self, today: dt.date) -> bool:
        """Applies through the day before ``expires``."""
        return today < self.expires

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "metric": self.metric, "reason": self.reason,
                "expires": self.expires.isoformat()}  # fmt: skip


@dataclass(frozen=True)
class Policy:
    """A whole policy file, validated."""

    source: str
    metrics: tuple[MetricRule, ...]
    alpha: float = DEFAULT_ALPHA
    min_paired_coverage: float = DEFAULT_MIN_PAIRED_COVERAGE
    max_input_mismatch: float = DEFAULT_MAX_INPUT_MISMATCH
    waivers: tuple[Waiver, ...] = field(default_factory=tuple)

    def rule(self, metric: str) -> MetricRule | None:
        return next((r for r in self.metrics if r.name == metric), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "alpha": self.alpha, "min_paired_coverage": self.min_paired_coverage,
            "max_input_mismatch": self.max_input_mismatch, "metrics": [r.to_json() for r in self.metrics],
            "waivers": [w.to_json() for w in self.waivers],
        }  # fmt: skip


def waiver_words(waiver: dict[str, Any]) -> str:
    """A waiver (``Waiver.to_json``) in words: ``task 17, metric reward (expires 2027-01-31):
    reason``; a text key quoted (``task '17'``), so that it reads apart from the integer."""
    what = ", ".join(
        x
        for x in (
            f"task {waiver['task']!r}" if waiver["task"] is not None else "",
            f"metric {waiver['metric']}" if waiver["metric"] else "",
        )
        if x
    )
    return f"{what} (expires {waiver['expires']}): {waiver['reason']}"


class _DuplicateKey(Exception):
    """A mapping that holds a key twice (YAML loaders keep the last one silently)."""

    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"line {line}: key {_shown(key)} is given twice (only one can apply)")


class _NoDates(yaml.SafeLoader):
    """YAML without implicit timestamps (``expires: 2026-02-30`` reaches the check as text),
    numbers as YAML 1.2 reads them (below), and a key given twice in one mapping refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the loader itself refuses it
                continue
            if duplicate:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's core schema for numbers: YAML 1.1 reads 017 as 15 (octal), 1:30 as 90 (base 60)
# and wants a dot in 1.0e-3; a policy reads as written (017 is 17; 0x11, 1_7 and 1:30 stay text)
_YAML_1_1_SCALARS = ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_NoDates.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_1_1_SCALARS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
DECIMAL_INT = re.compile(r"^[-+]?[0-9]+$")
CORE_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"  # 1, 1.5, .5, 1e-3
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"  # refused as not finite, by name
)
_NoDates.add_implicit_resolver("tag:yaml.org,2002:int", DECIMAL_INT, list("-+0123456789"))
_NoDates.add_implicit_resolver("tag:yaml.org,2002:float", CORE_FLOAT, list("-+0123456789."))


def _decimal_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value = loader.construct_scalar(node)
    return int(value, 10) if DECIMAL_INT.match(value) else loader.construct_yaml_int(node)


_NoDates.add_constructor("tag:yaml.org,2002:int", _decimal_int)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 80, 80, 40
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 4


def _shown(value: Any) -> str:
    """``repr(value)`` cut short: a value built of nested YAML aliases (millions of items from a
    few bytes) or a 400-digit integer is named in a few words, never spelled out."""
    return _REPR.repr(value)


def load_policy(path: str | Path) -> Policy:
    """Read and validate the policy at ``path``; PolicyError naming the problem."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)  # a file that never ends (/dev/zero) is not read whole
        if len(raw) > MAX_POLICY_BYTES:
            raise PolicyError(f"--policy {path}: too large for a policy (over {MAX_POLICY_BYTES:,} bytes)")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"--policy {path}: cannot read it: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_NoDates)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(f"--policy {path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    except _DuplicateKey as exc:
        raise PolicyError(f"--policy {path}: {exc}") from exc
    return parse_policy(data, str(path))


def _fail(source: str, where: str, message: str) -> PolicyError:
    return PolicyError(f"--policy {source}: {where}: {message}" if where else f"--policy {source}: {message}")


def _mapping(value: Any, source: str, where: str, known: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        got = "an empty file" if value is None and not where else type(value).__name__
        raise _fail(source, where, f"expected a mapping of {', '.join(known)} (got {got})")
    for key in value:
        if key not in known:
            name = str(key)[:80]
            raise _fail(
                source, f"{where}.{name}" if where else name,
                f"unknown key {_shown(key)}{did_you_mean(name, known)} (known: {', '.join(known)})",
            )  # fmt: skip
    return value


def _number(value: Any, source: str, where: str, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(source, where, f"expected a number, got {_shown(value)}")
    try:
        number = float(value)  # an integer past float64 (400 digits) overflows here
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _fail(source, where, f"expected a finite number, got {_shown(value)}")
    if number < low or (high is not None and number > high):
        bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise _fail(source, where, f"must be {bound} (got {_shown(value)})")
    return number + 0.0  # -0.0 reads 0


def _choice(value: Any, source: str, where: str, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        hint = did_you_mean(value, allowed) if isinstance(value, str) else ""
        raise _fail(source, where, f"{_shown(value)} is not one of {', '.join(allowed)}{hint}")
    return str(value)


def _text(value: Any, source: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, where, f"expected a non-empty text, got {_shown(value)}")
    return value


def _date(value: Any, source: str, where: str) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    try:
        return dt.date.fromisoformat(value) if isinstance(value, str) else _not_a_date(value)
    except ValueError as exc:
        raise _fail(source, where, f"{_shown(value)} is not a date (YYYY-MM-DD): {exc}") from exc


def _not_a_date(value: Any) -> dt.date:
    raise ValueError(f"a {type(value).__name__}")


def _metric(raw: Any, source: str, where: str) -> MetricRule:
    m = _mapping(raw, source, where, METRIC_KEYS)
    if "name" not in m:
        raise _fail(source, where, "every metric needs a name")
    words = (*ALTERNATIVES, *ALTERNATIVE_SYNONYMS)
    alternative = _choice(m.get("alternative", "two-sided"), source, f"{where}.alternative", words)
    return MetricRule(
        name=_text(m["name"], source, f"{where}.name"),
        direction=_choice(m.get("direction", "higher_is_better"), source, f"{where}.direction", DIRECTIONS),
        margin=_number(m.get("margin", 0.0), source, f"{where}.margin", 0.0),
        alternative=ALTERNATIVE_SYNONYMS.get(alternative, alternative),
        tier=_choice(m.get("tier", "blocking"), source, f"{where}.tier", TIERS),
    )


def _waiver(raw: Any, source: str, where: str) -> Waiver:
    w = _mapping(raw, source, where, WAIVER_KEYS)
    if "task" not in w and "metric" not in w:
        raise _fail(source, where, "a waiver names a task, a metric, or both")
    for key in ("reason", "expires"):
        if key not in w:
            raise _fail(source, where, f"a waiver needs a {key}")
    task = w.get("task")
    if task is not None and (isinstance(task, bool) or not isinstance(task, int | str) or task == ""):
        raise _fail(
            source, f"{where}.task", f"expected a task key (an integer or a text), got {_shown(task)}"
        )
    return Waiver(
        reason=_text(w["reason"], source, f"{where}.reason"),
        expires=_date(w["expires"], source, f"{where}.expires"),
        task=task,
        metric=_text(w["metric"], source, f"{where}.metric") if "metric" in w else None,
    )


def parse_policy(data: Any, source: str) -> Policy:
    """A Policy from parsed YAML ``data``; PolicyError naming the first problem."""
    top = _mapping(data, source, "", TOP_KEYS)
    if isinstance(top.get("version"), bool) or top.get("version", 1) != 1:
        raise _fail(source, "version", f"only version 1 is known (got {_shown(top.get('version'))})")
    raw_metrics = top.get("metrics")
    if not isinstance(raw_metrics, list) or not raw_metrics:
        raise _fail(source, "metrics", "expected a non-empty list of metrics (each with a name)")
    metrics = tuple(_metric(m, source, f"metrics[{i}]") for i, m in enumerate(raw_metrics))
    seen: set[str] = set()
    for rule in metrics:
        if rule.name in seen:
            raise _fail(source, "metrics", f"{rule.name!r} is listed twice")
        seen.add(rule.name)
    raw_waivers = top.get("waivers")
    raw_waivers = [] if raw_waivers is None else raw_waivers  # "waivers:" with nothing under it
    if not isinstance(raw_waivers, list):
        raise _fail(source, "waivers", "expected a list of waivers")
    alpha = _number(top.get("alpha", DEFAULT_ALPHA), source, "alpha", 0.0, 1.0)
    if not 0 < alpha < 0.5:
        raise _fail(source, "alpha", f"must be above 0 and below 0.5 (got {alpha!r})")
    return Policy(
        source=source,
        metrics=metrics,
        alpha=alpha,
        min_paired_coverage=_number(
            top.get("min_paired_coverage", DEFAULT_MIN_PAIRED_COVERAGE),
            source,
            "min_paired_coverage",
            0.0,
            1.0,
        ),
        max_input_mismatch=_number(
            top.get("max_input_mismatch", DEFAULT_MAX_INPUT_MISMATCH), source, "max_input_mismatch", 0.0, 1.0
        ),
        waivers=tuple(_waiver(w, source, f"waivers[{i}]") for i, w in enumerate(raw_waivers)),
    )
