"""Base against each candidate: pairing by task, the paired test per metric, and the verdict.

``compare_runs(base, candidates)`` reads every run once (``tasks.read_run_tasks``), pairs each
candidate with the base by task key, and tests each metric with ``stats.paired_test``. Tasks in
only one run, and tasks whose every rollout failed, are counted and listed (never dropped, never
scored as zero). The result is plain data (``to_json``) that the page, the CLI and ``--log`` show.

Task identity (``tasks.input_digest``): a task whose input differs between the two runs is left
out of every test and counted (``input_differs``); past ``max_input_mismatch`` of the tasks both
runs hold, or when the runs are on different benchmarks (disjoint environment servers), the
comparison is refused (CompareError). With a ``policy`` (``policy.Policy``), each candidate also
gets the release gate's verdict (``gate.gate``).
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_artifacts.compare.gate import gate, worst
from gym_artifacts.compare.policy import DEFAULT_MAX_INPUT_MISMATCH, Policy
from gym_artifacts.compare.stats import DEFAULT_ALPHA, PairedResult, check_alpha_margin, paired_test
from gym_artifacts.compare.tasks import PRIMARY_METRIC, RunTasks, TaskKey, read_run_tasks, sort_key
from gym_artifacts.core.errors import GymArtifactsError
from gym_artifacts.core.jsonio import attributes_json
from gym_artifacts.core.suggest import did_you_mean
from gym_artifacts.run.artifacts import RunArtifacts

LISTED_TASKS = 1000  # unpaired tasks listed by key in the JSON (all are counted)


class CompareError(GymArtifactsError):
    """A comparison that cannot be made as asked (an unknown metric, a bad alpha or margin, runs
    of different tasks or benchmarks)."""


def finite_or_none(value: float | None) -> float | None:
    """``value`` when it is a finite number, else None: no page, JSON or verdict shows inf/NaN."""
    return value if value is not None and math.isfinite(value) else None


@dataclass
class TaskRow:
    """One task of a pair of runs: each side's state and value of the primary metric."""

    key: TaskKey
    base_state: str
    candidate_state: str
    base_value: float | None
    candidate_value: float | None
    base_failed: int
    candidate_failed: int
    input_differs: bool = False  # both runs hold the task, with different inputs: never paired

    @property
    def delta(self) -> float | None:
        """candidate - base; None when not paired or not computable (a difference past float64)."""
        if self.base_value is None or self.candidate_value is None or self.input_differs:
            return None
        return finite_or_none(self.candidate_value - self.base_value)

    def to_json(self) -> dict[str, Any]:
        return attributes_json(
            self,
            "task=key base=base_state candidate=candidate_state base_value candidate_value delta"
            " input_differs base_failed_rollouts=base_failed candidate_failed_rollouts=candidate_failed",
        )


@dataclass
class CandidateComparison:
    """One candidate against the base."""

    candidate: RunTasks
    primary_metric: str | None
    results: list[PairedResult]
    rows: list[TaskRow]  # every task either run knows of, by key
    verdict: dict[str, Any] = field(default_factory=dict)
    gate: dict[str, Any] | None = None  # the policy's verdict (``gate.gate``), with a policy only

    def rows_where(self, base: set[str] | None = None, candidate: set[str] | None = None) -> list[TaskRow]:
        return [
            r
            for r in self.rows
            if (base is None or r.base_state in base)
            and (candidate is None or r.candidate_state in candidate)
        ]

    def pairing(self) -> dict[str, Any]:
        """How the tasks paired: counts, and the unpaired and failed tasks listed by key."""
        differs = [r for r in self.rows if r.input_differs]
        groups = {
            "paired": [r for r in self.rows_where({"scored"}, {"scored"}) if not r.input_differs],
            "input_differs": differs,
            "only_in_base": self.rows_where({"scored"}, {"failed", "no result", "absent"}),
            "only_in_candidate": self.rows_where({"failed", "no result", "absent"}, {"scored"}),
            "in_neither": self.rows_where(
                {"failed", "no result", "absent"}, {"failed", "no result", "absent"}
            ),
        }
        out: dict[str, Any] = {name: len(rows) for name, rows in groups.items()}
        for name in ("only_in_base", "only_in_candidate", "in_neither", "input_differs"):
            out[f"{name}_tasks"] = [
                {"task": r.key, "base": r.base_state, "candidate": r.candidate_state}
                for r in groups[name][:LISTED_TASKS]
            ]
        failed = [r for r in self.rows if r.base_failed or r.candidate_failed]
        out["tasks_with_failed_rollouts"] = len(failed)
        out["failed_tasks"] = [
            {
                "task": r.key,
                "base_failed_rollouts": r.base_failed,
                "candidate_failed_rollouts": r.candidate_failed,
            }
            for r in failed[:LISTED_TASKS]
        ]
        return out

    def to_json(self) -> dict[str, Any]:
        out = {
            "candidate": self.candidate.summary(),
            "primary_metric": self.primary_metric,
            "verdict": self.verdict,
            "pairing": self.pairing(),
            "results": [r.to_json() for r in self.results],
        }
        if self.gate is not None:
            out["gate"] = self.gate
        return out


@dataclass
class Comparison:
    """The whole comparison: the base, each candidate, and the settings it was made with."""

    base: RunTasks
    candidates: list[CandidateComparison]
    alpha: float
    margin: float | None
    metrics_requested: list[str] | None
    policy: Policy | None = None
    today: dt.date | None = None  # the day waivers were judged on (with a policy)

    def gate(self) -> dict[str, Any] | None:
        """The policy's overall verdict (the worst candidate's) and the expired waivers; None
        without a policy."""
        if self.policy is None or self.today is None:
            return None
        today = self.today
        return {
            "verdict": worst([c.gate["verdict"] for c in self.candidates if c.gate is not None]),
            "policy": self.policy.to_json(),
            "today": today.isoformat(),
            "expired_waivers": [w.to_json() for w in self.policy.waivers if not w.active(today)],
            "unmatched_waivers": [w.to_json() for w in self._unmatched_waivers()],
        }

    def _unmatched_waivers(self) -> list[Any]:
        """Waivers naming a task no run holds (``task: 17`` for a ``task_id: "17"`` run, a typo)
        or a metric the policy does not test: they could never apply."""
        assert self.policy is not None
        runs = [self.base, *(c.candidate for c in self.candidates)]
        keys = {(type(k), k) for run in runs for k in run.tasks()}
        tested = {r.name for r in self.policy.metrics}
        return [
            w for w in self.policy.waivers
            if (w.task is not None and (type(w.task), w.task) not in keys)
            or (w.metric is not None and w.metric not in tested)
        ]  # fmt: skip

    @property
    def framing(self) -> str:
        return "two-sided" if self.margin is None else "non-inferiority"

    def to_json(self) -> dict[str, Any]:
        return {
            "method": (
                "paired test over per-task means (NeMo Gym statistical_tests): one mean per task "
                "and run, deltas candidate - base over tasks scored in both, Student t with n-1 df"
            ),
            "framing": self.framing,
            "alpha": self.alpha,
            "margin": self.margin,
            "base": self.base.summary(),
            "comparisons": [c.to_json() for c in self.candidates],
            **({"gate": self.gate()} if self.policy is not None else {}),
        }


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def verdict(result: PairedResult | None, candidate: str, base: str) -> dict[str, Any]:
    """The one-line answer for the primary metric: ``kind`` and ``text``."""
    if result is None:
        return {"kind": "cannot-tell", "text": f"{candidate} vs {base}: no metric is in both runs"}
    metric = result.metric
    where = f"{candidate} vs {base} on {metric}"
    if result.p_value is None:
        return {"kind": "cannot-tell", "text": f"{where}: cannot tell ({result.note})"}
    level = f"{result.ci_level:.0%}" if result.ci_level is not None else ""
    figures = (
        f"difference {_fmt(result.mean_diff, True)}, {level} CI [{_fmt(result.ci_low, True)}, "
        f"{_fmt(result.ci_high, True)}], p={result.p_value:.3g}, n={result.n_pairs} tasks"
    )
    mde = result.minimum_detectable_effect
    power = (
        f"; the smallest effect this sample detects at 80% power is {_fmt(mde)}" if mde is not None else ""
    )
    if result.framing == "two-sided":
        if result.significant:
            kind = "higher" if (result.mean_diff or 0) > 0 else "lower"
            return {"kind": kind, "text": f"{where}: significantly {kind} ({figures})"}
        return {"kind": "no-difference", "text": f"{where}: no significant difference ({figures}{power})"}
    margin = _fmt(result.margin)
    if result.significant:
        return {"kind": "non-inferior",
                "text": f"{where}: not worse than the base by more than {margin} ({figures})"}  # fmt: skip
    return {"kind": "not-shown",
            "text": f"{where}: non-inferiority within {margin} not shown ({figures}{power})"}  # fmt: skip


def _choose_metrics(base: RunTasks, candidate: RunTasks, requested: Sequence[str] | None) -> list[str]:
    if requested:
        return list(dict.fromkeys(requested))
    theirs = set(candidate.metrics())
    return [m for m in base.metrics() if m in theirs]


def compare_pair(
    base: RunTasks,
    candidate: RunTasks,
    *,
    metrics: Sequence[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
    margin: float | None = None,
    policy: Policy | None = None,
    today: dt.date | None = None,
) -> CandidateComparison:
    """Pair ``candidate`` with ``base`` by task and test each metric (and gate it, with a policy)."""
    chosen = _choose_metrics(base, candidate, metrics)
    larger = max(base.scored_task_count(), candidate.scored_task_count())
    differs = inputs_differ(base, candidate)
    results: list[PairedResult] = []
    for metric in chosen:
        b, c = base.means(metric), candidate.means(metric)
        common = sorted((b.keys() & c.keys()) - differs, key=sort_key)
        deltas = [c[k] - b[k] for k in common]
        results.append(
            paired_test(deltas, metric=metric, alpha=alpha, margin=margin, tasks_in_larger_run=larger)
        )
    primary = chosen[0] if chosen else None
    b_vals = base.means(primary) if primary else {}
    c_vals = candidate.means(primary) if primary else {}
    rows = [
        TaskRow(
            key=k, base_state=base.state(k), candidate_state=candidate.state(k),
            base_value=b_vals.get(k), candidate_value=c_vals.get(k),
            base_failed=base.failed.get(k, 0), candidate_failed=candidate.failed.get(k, 0),
            input_differs=k in differs,
        )
        for k in sorted(base.tasks() | candidate.tasks(), key=sort_key)
    ]  # fmt: skip
    out = CandidateComparison(candidate=candidate, primary_metric=primary, results=results, rows=rows)
    out.verdict = verdict(results[0] if results else None, candidate.name, base.name)
    unpaired = unpaired_text(out.rows)
    if unpaired:
        out.verdict["text"] += f"; {unpaired}"
    if differs:
        out.verdict["text"] += f"; {_tasks(len(differs))} whose inputs differ between the runs left out"
    if policy is not None:
        out.gate = gate(base, candidate, policy, excluded=differs, input_differs=len(differs),
                        today=today or dt.date.today())  # fmt: skip
    return out


def inputs_differ(base: RunTasks, candidate: RunTasks) -> set[TaskKey]:
    """Tasks both runs hold whose inputs (``tasks.input_digest``) differ."""
    return {k for k in base.inputs.keys() & candidate.inputs.keys() if base.inputs[k] != candidate.inputs[k]}


def check_same_tasks(base: RunTasks, candidate: RunTasks, max_mismatch: float) -> None:
    """CompareError when the two runs are on different benchmarks (no environment server in
    common, and no task inputs showing they are the same tasks: a renamed server with the same
    inputs is compared), or when more than ``max_mismatch`` of the tasks both hold have
    different inputs (another task set under the same keys): a confident result on different
    questions is worse than none."""
    common = base.inputs.keys() & candidate.inputs.keys()
    differs = inputs_differ(base, candidate)
    same_inputs = bool(common) and len(differs) <= max_mismatch * len(common)
    if (
        base.benchmarks
        and candidate.benchmarks
        and not base.benchmarks & candidate.benchmarks
        and not same_inputs
    ):
        raise CompareError(
            f"{candidate.name} and {base.name} are runs of different benchmarks: the base ran "
            f"{', '.join(sorted(base.benchmarks))}, the candidate ran "
            f"{', '.join(sorted(candidate.benchmarks))}; "
            "compare runs of the same benchmark"
        )
    if common and not same_inputs:
        raise CompareError(
            f"{candidate.name} and {base.name}: for {len(differs)} of {len(common)} tasks in both runs the "
            f"inputs differ (the limit is {max_mismatch:.0%}): the same task keys name different questions, "
            "so these are not runs of the same tasks "
            "(set max_input_mismatch in a --policy file to allow more)"
        )


STATE_WORDS = {"failed": "failed", "no result": "with no result", "absent": "not in the run"}


def _tasks(n: int) -> str:
    return f"{n} task{'' if n == 1 else 's'}"


def unpaired_text(rows: Sequence[TaskRow]) -> str:
    """What the test left out and why: ``1 task only in the base (failed in the candidate: 1)``;
    "" when every task paired and no rollout failed."""
    parts = []
    groups = (
        ("only in the base", "candidate", [r for r in rows if r.base_state == "scored" != r.candidate_state]),
        ("only in the candidate", "base", [r for r in rows if r.candidate_state == "scored" != r.base_state]),
    )
    for what, other, group in groups:
        if group:
            states: dict[str, int] = {}
            for r in group:
                state = r.candidate_state if other == "candidate" else r.base_state
                states[state] = states.get(state, 0) + 1
            why = ", ".join(f"{v} {STATE_WORDS[k]}" for k, v in sorted(states.items()))
            parts.append(f"{_tasks(len(group))} {what} (in the {other}: {why})")
    neither = [r for r in rows if r.base_state != "scored" and r.candidate_state != "scored"]
    if neither:
        parts.append(f"{_tasks(len(neither))} scored in neither")
    text = "not paired: " + "; ".join(parts) if parts else ""
    partly = [r for r in rows if r.delta is not None and (r.base_failed or r.candidate_failed)]
    if partly:
        text += ("; " if text else "") + f"{_tasks(len(partly))} paired on their scored rollouts only"
    return text + " (failed rollouts are never scored as 0)" if text else ""


def name_apart(base: RunTasks, candidates: Sequence[RunTasks]) -> None:
    """Give each candidate a name no other run of the comparison has: the tables, the Markdown
    and the trackers' metric keys (``<candidate>/<metric>/...``) tell candidates apart by name.
    A clash (``a/new/eval`` and ``b/new/eval`` both ``new/eval``, or one run given twice) takes
    the path as given, then a number."""
    counts: dict[str, int] = {}
    for run in (base, *candidates):
        counts[run.name] = counts.get(run.name, 0) + 1
    taken = {base.name} | {c.name for c in candidates if counts[c.name] == 1}
    for c in candidates:
        if counts[c.name] == 1:
            continue
        label, n = c.run.source, 1
        while label in taken:
            n += 1
            label = f"{c.run.source} ({n})"
        c.label = label
        taken.add(label)


def compare_runs(
    base: RunArtifacts | str | os.PathLike[str],
    candidates: Sequence[RunArtifacts | str | os.PathLike[str]],
    *,
    metrics: Sequence[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
    margin: float | None = None,
    policy: Policy | None = None,
    today: dt.date | None = None,
) -> Comparison:
    """Compare each candidate with ``base`` (see the module doc).

    ``metrics``: the metrics to test, the first one being the verdict's (default: every metric
    both runs have, ``reward`` first). ``policy``: its metrics and alpha are the test's, and each
    candidate gets the gate's verdict, waivers judged on ``today`` (default: the local date).
    CompareError for a bad alpha or margin, no candidate, a requested metric that neither run
    has, or runs of different tasks or benchmarks; RunError / MissingRunError for an unreadable run.
    """
    if policy is not None:
        metrics, alpha, margin = [r.name for r in policy.metrics], policy.alpha, None
        today = today or dt.date.today()
    max_mismatch = policy.max_input_mismatch if policy is not None else DEFAULT_MAX_INPUT_MISMATCH
    try:
        check_alpha_margin(alpha, margin)
    except ValueError as exc:
        raise CompareError(str(exc)) from exc
    if not candidates:
        raise CompareError("give at least one candidate run to compare with the base")
    base_tasks = read_run_tasks(base)
    all_tasks = [read_run_tasks(candidate) for candidate in candidates]
    name_apart(base_tasks, all_tasks)
    pairs: list[CandidateComparison] = []
    for cand_tasks in all_tasks:
        for metric in metrics or []:
            if metric not in base_tasks.metrics() and metric not in cand_tasks.metrics():
                known = sorted(set(base_tasks.metrics()) | set(cand_tasks.metrics()))
                where = f"--policy {policy.source}" if policy is not None else "--metric"
                raise CompareError(
                    f"{where}: metric {metric!r}: neither {base_tasks.name} nor {cand_tasks.name} has it"
                    f"{did_you_mean(metric, known)} (they have: {', '.join(known) or 'no metric'})"
                )
        check_same_tasks(base_tasks, cand_tasks, max_mismatch)
        pairs.append(compare_pair(base_tasks, cand_tasks, metrics=metrics, alpha=alpha, margin=margin,
                                  policy=policy, today=today))  # fmt: skip
    return Comparison(
        base=base_tasks, candidates=pairs, alpha=alpha, margin=margin,
        metrics_requested=list(metrics) if metrics else None, policy=policy, today=today,
    )  # fmt: skip


__all__ = ["PRIMARY_METRIC", "CompareError", "Comparison", "compare_runs"]
