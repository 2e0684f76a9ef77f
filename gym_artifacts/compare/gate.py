"""The release gate: a policy's verdict for one candidate, PASS / WARN / FAIL / INCONCLUSIVE.

Each metric of the policy is tested on the paired per-task deltas, turned so that a positive
difference is always better (``lower_is_better`` metrics are negated), against the margin
``m`` (the worsening tolerated). With ``mean`` and ``se`` of those oriented deltas and Student's
t with ``n - 1`` degrees of freedom, the ``alternative`` says where the burden of proof lies:

- ``two-sided``: the ``1 - alpha`` interval. *pass* when its lower end is above ``-m`` (not
  worse by more than the margin, shown), *regressed* when its upper end is below ``-m`` (worse
  by more than the margin, shown), *inconclusive* when it reaches both sides.
- ``greater``: the candidate must show it is not worse by more than ``m`` (non-inferiority):
  *pass* when the one-sided ``1 - alpha`` lower bound is above ``-m``, else *regressed*.
- ``less``: a regression must be shown: *regressed* when the one-sided ``1 - alpha`` upper bound
  is below ``-m``, else *pass*.

A metric is *inconclusive* whatever its alternative when the test cannot be made: fewer
paired tasks than ``min_paired_coverage`` of the larger run's tasks, fewer than two pairs, or
values whose statistics overflow float64 ("not computable"). Every zero-variance sample is read
from its mean (as ``stats.paired_test``).

Waivers: an active metric waiver turns that metric's *regressed* or *inconclusive* into
*waived*; an active task waiver leaves the task out of every metric's test (of the waiver's
metric only, when it names one). Expired waivers do not apply and are reported.

The candidate's verdict: FAIL when a blocking metric regressed; else INCONCLUSIVE when a
blocking metric is inconclusive; else WARN when a metric was waived, a blocking metric is shown
worse than the base but within its margin (a real regression within the tolerance: NeMo Gym's
epic #1493), a tracked metric regressed or could not be tested at all, a waived task regressed,
or tasks were left out because their inputs differ; else PASS.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gym_artifacts.compare.policy import MetricRule, Policy, Waiver
from gym_artifacts.compare.stats import EPS, NOT_COMPUTABLE, finite, mean_and_se, scipy_stats
from gym_artifacts.compare.tasks import TaskKey, sort_key

if TYPE_CHECKING:
    from gym_artifacts.compare.tasks import RunTasks

VERDICTS = ("PASS", "WARN", "INCONCLUSIVE", "FAIL")  # from best to worst
EXIT_CODES = {"PASS": 0, "WARN": 3, "INCONCLUSIVE": 4, "FAIL": 5}


def worst(verdicts: Sequence[str]) -> str:
    """The worst of ``verdicts`` (PASS for none)."""
    return max(verdicts, key=VERDICTS.index, default="PASS")


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4g}"


def _oriented_bounds(
    rule: MetricRule, alpha: float, mean: float, se: float, n: int
) -> tuple[float, float, float]:
    """``(low, high, level)`` of the oriented difference's interval for the rule's alternative."""
    t = scipy_stats().t
    if se < EPS:
        return mean, mean, 1 - alpha
    tail = alpha / 2 if rule.alternative == "two-sided" else alpha
    half = float(t.ppf(1 - tail, n - 1)) * se
    return mean - half, mean + half, 1 - 2 * tail


def _p_value(rule: MetricRule, mean: float, se: float, n: int) -> float | None:
    """The p-value of the rule's alternative against the shifted null ``-margin``."""
    if se < EPS:
        return None
    t = scipy_stats().t
    stat = (mean + rule.margin) / se
    if not math.isfinite(stat):
        return None
    if rule.alternative == "greater":
        return float(t.sf(stat, n - 1))
    if rule.alternative == "less":
        return float(t.cdf(stat, n - 1))
    return float(2 * t.sf(abs(stat), n - 1))


def decide_metric(
    rule: MetricRule,
    deltas: Sequence[float],
    alpha: float,
    min_coverage: float,
    larger_run: int,
    waived: int = 0,
) -> dict[str, Any]:
    """One metric's status (pass / regressed / inconclusive), its figures in the metric's own
    units, and the reason in words. ``waived``: paired tasks left out by a task waiver; they count
    as covered (left out on purpose), so a waiver never lowers the coverage."""
    sign = -1.0 if rule.lower_is_better else 1.0
    better = "lower is better" if rule.lower_is_better else "higher is better"
    out: dict[str, Any] = {**rule.to_json(), "n_pairs": len(deltas), "difference": None, "ci_low": None,
                           "ci_high": None, "ci_level": None, "p_value": None,
                           "worse_within_margin": False}  # fmt: skip
    name = rule.name

    def inconclusive(why: str) -> dict[str, Any]:
        return {**out, "status": "inconclusive", "reason": f"{name}: inconclusive: {why}"}

    if any(not math.isfinite(d) for d in deltas):
        return inconclusive(f"{NOT_COMPUTABLE}: a per-task difference overflows")
    n, mean, se = mean_and_se([sign * d for d in deltas])
    if n == 0 or mean is None:
        return inconclusive("no task has it in both runs")
    out["difference"] = sign * mean
    if n + waived < min_coverage * larger_run:
        also = f" (+{waived} waived)" if waived else ""
        return inconclusive(
            f"paired coverage {n}{also} of {larger_run} tasks is below the policy's minimum "
            f"{min_coverage:.0%}"
        )
    if n < 2:
        return inconclusive("only 1 paired task: a standard error needs at least 2")
    if se is None:
        return inconclusive(f"{NOT_COMPUTABLE}: the standard error")
    low, high, level = _oriented_bounds(rule, alpha, mean, se, n)
    if not finite(low, high):
        return inconclusive(f"{NOT_COMPUTABLE}: the interval")
    raw_low, raw_high = (-high, -low) if rule.lower_is_better else (low, high)
    out.update(ci_low=raw_low, ci_high=raw_high, ci_level=level, p_value=_p_value(rule, mean, se, n))
    threshold = -rule.margin
    figures = (
        f"difference {_signed(sign * mean)} ({level:.0%} CI [{_signed(raw_low)}, {_signed(raw_high)}], "
        f"n={n}; {better}, margin {rule.margin:g}, {rule.alternative})"
    )
    shown_not_worse = low > threshold + (EPS if se < EPS else 0.0)
    shown_worse = high < threshold - (EPS if se < EPS else 0.0)
    if rule.alternative == "greater":
        status = "pass" if shown_not_worse else "regressed"
        words = "not worse than the base by more than the margin" if shown_not_worse else (
            "not shown to be within the margin of the base"
        )  # fmt: skip
    elif rule.alternative == "less":
        status = "regressed" if shown_worse else "pass"
        words = (
            "worse than the base by more than the margin"
            if shown_worse
            else "no regression beyond the margin shown"
        )
    elif shown_not_worse:
        status, words = "pass", "not worse than the base by more than the margin"
    elif shown_worse:
        status, words = "regressed", "worse than the base by more than the margin"
    else:
        status, words = "inconclusive", "the interval reaches both sides of the margin: more tasks are needed"
    # NeMo Gym's epic #1493: a regression shown real but within the tolerance is worth a WARN
    out["worse_within_margin"] = status == "pass" and high < -(EPS if se < EPS else 0.0)
    if out["worse_within_margin"]:
        words = "worse than the base (shown), but within the margin"
    return {**out, "status": status, "reason": f"{name}: {words}: {figures}"}


def _task_waived(waivers: Sequence[Waiver], key: TaskKey, metric: str) -> Waiver | None:
    for w in waivers:
        if w.task is not None and w.task == key and type(w.task) is type(key) and w.metric in (None, metric):
            return w
    return None


def gate(
    base: RunTasks,
    candidate: RunTasks,
    policy: Policy,
    *,
    excluded: set[TaskKey],
    input_differs: int,
    today: dt.date,
) -> dict[str, Any]:
    """The candidate's verdict under ``policy`` (see the module doc): ``verdict``, ``reasons`` and
    one entry per metric (``status``, ``reason``, figures in the metric's units)."""
    active = [w for w in policy.waivers if w.active(today)]
    larger = max(base.scored_task_count(), candidate.scored_task_count())
    metrics: list[dict[str, Any]] = []
    waived_tasks: list[dict[str, Any]] = []
    for rule in policy.metrics:
        b, c = base.means(rule.name), candidate.means(rule.name)
        deltas: list[float] = []
        for key in sorted((b.keys() & c.keys()) - excluded, key=sort_key):
            waiver = _task_waived(active, key, rule.name)
            delta = c[key] - b[key]
            if waiver is None:
                deltas.append(delta)
                continue
            worse = (-delta if rule.lower_is_better else delta) < -rule.margin
            waived_tasks.append(
                {"task": key, "metric": rule.name, "regressed": worse, "reason": waiver.reason,
                 "expires": waiver.expires.isoformat()}
            )  # fmt: skip
        waived = sum(1 for w in waived_tasks if w["metric"] == rule.name)
        decided = decide_metric(rule, deltas, policy.alpha, policy.min_paired_coverage, larger, waived)
        waiver = next((w for w in active if w.task is None and w.metric == rule.name), None)
        if waiver is not None and decided["status"] in ("regressed", "inconclusive"):
            until = f"waived until {waiver.expires.isoformat()}: {waiver.reason}"
            decided = {**decided, "status": "waived", "waived_status": decided["status"],
                       "reason": f"{decided['reason']}; {until}"}  # fmt: skip
        metrics.append(decided)
    blocking = [m for m in metrics if m["tier"] == "blocking"]
    reasons: list[str] = []
    if any(m["status"] == "regressed" for m in blocking):
        verdict = "FAIL"
        reasons += [m["reason"] for m in blocking if m["status"] == "regressed"]
    elif any(m["status"] == "inconclusive" for m in blocking):
        verdict = "INCONCLUSIVE"
        reasons += [m["reason"] for m in blocking if m["status"] == "inconclusive"]
    else:
        warnings = [m["reason"] for m in metrics if m["status"] == "waived"]
        warnings += [m["reason"] for m in blocking if m["worse_within_margin"]]
        warnings += [
            f"tracked {m['reason']}" for m in metrics if m["tier"] == "tracked" and m["status"] == "regressed"
        ]
        # a tracked metric that could not be tested at all (no interval): never a PASS on no evidence
        warnings += [
            f"tracked {m['reason']}"
            for m in metrics
            if m["tier"] == "tracked" and m["status"] == "inconclusive" and m["ci_low"] is None
        ]
        warnings += [
            f"task {w['task']} regressed on {w['metric']} (waived until {w['expires']}: {w['reason']})"
            for w in waived_tasks
            if w["regressed"]
        ]
        if input_differs:
            warnings.append(f"{input_differs} task(s) left out: their inputs differ between the runs")
        verdict = "WARN" if warnings else "PASS"
        reasons += warnings or ["every blocking metric is within its margin"]
    return {"verdict": verdict, "reasons": reasons, "metrics": metrics, "waived_tasks": waived_tasks}
