"""``compare --policy``: a release gate a CI job can act on.

A policy with a lower-is-better token metric and a waiver decides PASS, WARN, FAIL and
INCONCLUSIVE on generated NeMo Gym runs, each with its own exit code; the policy file is
validated strictly (exit 2 naming the key, with "did you mean"); tasks whose inputs differ
between the runs are excluded and counted, or the comparison refused past a threshold; runs
of different benchmarks are refused; three candidates share one page and one table; and any
task key with any finite value gives a page and a verdict (never a crash, never inf/NaN).
"""

from __future__ import annotations

import json
import math
import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.cli import main
from gym_artifacts.compare import compare_runs
from gym_artifacts.compare.page import render_compare_page
from tests.nemo_gym_runs import write_run

TASKS = 30
EXIT = {"PASS": 0, "WARN": 3, "INCONCLUSIVE": 4, "FAIL": 5}

POLICY = """\
version: 1
alpha: 0.05
min_paired_coverage: 0.9
metrics:
  - name: reward
    direction: higher_is_better
    margin: 0.05
    alternative: two-sided
    tier: blocking
  - name: output_tokens
    direction: lower_is_better
    margin: 5
    alternative: two-sided
    tier: blocking
waivers:
  - metric: output_tokens
    reason: longer answers are expected after the chain-of-thought change
    expires: {expires}
"""


def _noise(seed: int, t: int, r: int) -> float:
    return random.Random(seed * 100_003 + t * 101 + r).random()


def make_run(
    folder: Path,
    *,
    seed: int,
    lift: float = 0.0,
    tokens: float = 0.0,
    tasks: int = TASKS,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A NeMo Gym run whose reward is noise + ``lift`` and whose output tokens are about 100 +
    ``tokens`` per rollout."""
    path = write_run(
        folder / "eval.jsonl", tasks=tasks, repeats=2, seed=seed,
        reward_of=lambda t, r: 0.4 + 0.2 * _noise(seed, t, r) + lift,
    )  # fmt: skip
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in lines:
        usage = rec["response"]["usage"]
        usage["output_tokens"] = round(
            100 + tokens + 4 * _noise(seed + 7, rec["_ng_task_index"], rec["_ng_rollout_index"])
        )
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        if edit is not None:
            edit(rec)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _policy(tmp_path: Path, expires: str = "2099-12-31", text: str | None = None) -> Path:
    path = tmp_path / f"policy-{expires}-{len(text or '')}.yaml"
    path.write_text(text if text is not None else POLICY.format(expires=expires))
    return path


def _gate(
    tmp_path: Path, capsys: Any, base: Path, cands: list[Path], policy: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    code = main(["compare", str(base), *map(str, cands), "--policy", str(policy), "--json",
                 "-o", str(tmp_path / "c.html"), *extra])  # fmt: skip
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate")
    return {
        "base": make_run(root / "base", seed=1),
        # better reward, 30 fewer tokens: a lower-is-better metric that went down passes
        "better": make_run(root / "better", seed=2, lift=0.1, tokens=-30),
        # better reward, 40 more tokens: a regression of a blocking metric (waived: WARN)
        "verbose": make_run(root / "verbose", seed=3, lift=0.1, tokens=40),
        # worse reward by 0.2 on every task
        "worse": make_run(root / "worse", seed=4, lift=-0.2),
        # a third of the tasks: below the policy's paired coverage
        "partial": make_run(root / "partial", seed=5, lift=0.1, tasks=10),
    }


@pytest.mark.parametrize(
    ("candidate", "verdict"),
    [("better", "PASS"), ("verbose", "WARN"), ("worse", "FAIL"), ("partial", "INCONCLUSIVE")],
)
def test_the_policy_decides_each_verdict_with_its_exit_code(
    runs: dict[str, Path], tmp_path: Path, capsys: Any, candidate: str, verdict: str
) -> None:
    code, out = _gate(tmp_path, capsys, runs["base"], [runs[candidate]], _policy(tmp_path))
    (c,) = out["comparisons"]
    gate = c["gate"]
    assert gate["verdict"] == verdict, gate
    assert code == EXIT[verdict]
    assert out["gate"]["verdict"] == verdict
    by_metric = {m["metric"]: m for m in gate["metrics"]}
    assert set(by_metric) == {"reward", "output_tokens"}
    for m in gate["metrics"]:
        assert m["reason"] and m["direction"] in ("higher_is_better", "lower_is_better")
    if candidate == "better":
        assert by_metric["output_tokens"]["status"] == "pass"  # fewer tokens is better
        assert by_metric["output_tokens"]["difference"] < -20
    if candidate == "verbose":
        tokens = by_metric["output_tokens"]
        assert tokens["status"] == "waived" and "chain-of-thought" in tokens["reason"]
        assert by_metric["reward"]["status"] == "pass"
    if candidate == "worse":
        assert by_metric["reward"]["status"] == "regressed"
    if candidate == "partial":
        assert "coverage" in by_metric["reward"]["reason"]


def test_an_expired_waiver_stops_applying_and_is_reported(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    code, out = _gate(tmp_path, capsys, runs["base"], [runs["verbose"]], _policy(tmp_path, "2020-01-31"))
    gate = out["comparisons"][0]["gate"]
    assert gate["verdict"] == "FAIL" and code == EXIT["FAIL"]
    (expired,) = out["gate"]["expired_waivers"]
    assert expired["metric"] == "output_tokens" and expired["expires"] == "2020-01-31"
    assert next(m for m in gate["metrics"] if m["metric"] == "output_tokens")["status"] == "regressed"


def test_several_candidates_the_worst_verdict_is_the_exit_code(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    md = tmp_path / "summary.md"
    code, out = _gate(tmp_path, capsys, runs["base"], [runs["better"], runs["verbose"], runs["worse"]],
                      _policy(tmp_path), "--markdown", str(md))  # fmt: skip
    assert [c["gate"]["verdict"] for c in out["comparisons"]] == ["PASS", "WARN", "FAIL"]
    assert code == EXIT["FAIL"] and out["gate"]["verdict"] == "FAIL"
    text = md.read_text()
    # a PR comment: one table, a row per candidate and metric, each verdict and its reason
    assert text.startswith("## ") and "FAIL" in text and "WARN" in text and "PASS" in text
    for name in ("better/eval", "verbose/eval", "worse/eval"):
        assert name in text
    assert "| candidate |" in text and "chain-of-thought" in text
    assert len(text) < 60_000  # fits a GitHub comment


def test_a_lower_is_better_metric_that_rose_fails_without_a_waiver(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    text = POLICY.split("waivers:")[0]
    code, out = _gate(tmp_path, capsys, runs["base"], [runs["verbose"]], _policy(tmp_path, text=text))
    assert out["comparisons"][0]["gate"]["verdict"] == "FAIL" and code == EXIT["FAIL"]


def test_without_a_policy_the_exit_code_is_unchanged(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    assert main(["compare", str(runs["base"]), str(runs["worse"]), "-o", str(tmp_path / "c.html")]) == 0
    assert "gate" not in capsys.readouterr().out


# -- strict validation of the policy file ----------------------------------------------------------
BAD_POLICIES = [
    (
        "metrics:\n  - name: reward\n    directon: higher_is_better\n",
        ["directon", "did you mean 'direction'"],
    ),
    ("metrics:\n  - name: reward\n    direction: up\n", ["direction", "higher_is_better", "lower_is_better"]),
    ("metrics:\n  - name: reward\n    margin: a lot\n", ["margin", "number"]),
    ("metrics:\n  - name: reward\n    margin: -1\n", ["margin"]),
    (
        "metrics:\n  - name: reward\n    alternative: bigger\n",
        ["alternative", "two-sided", "greater", "less"],
    ),
    ("metrics:\n  - name: reward\n    tier: critical\n", ["tier", "blocking", "tracked"]),
    ("metrcs:\n  - name: reward\n", ["metrcs", "did you mean 'metrics'"]),
    (
        "metrics:\n  - name: reward\nwaivers:\n  - metric: reward\n    reason: x\n    expires: 2026-02-30\n",
        ["expires", "date"],
    ),
    ("metrics:\n  - name: reward\nwaivers:\n  - metric: reward\n    expires: 2026-02-01\n", ["reason"]),
    ("metrics:\n  - name: reward\nwaivers:\n  - reason: x\n    expires: 2026-02-01\n", ["task", "metric"]),
    ("metrics:\n  - name: reward\nmin_paired_coverage: 1.5\n", ["min_paired_coverage"]),
    ("metrics: []\n", ["metrics"]),
    ("- just a list\n", ["mapping"]),
    ("metrics:\n  - name: reward\n  - name: reward\n", ["reward", "twice"]),
    ("metrics: [\n", ["YAML"]),
    ("metrics:\n  - name: reward\nwaivers: {}\n", ["waivers", "list"]),
    ("metrics:\n  - name: reward\nwaivers: no\n", ["waivers", "list"]),
]


@pytest.mark.parametrize(("text", "words"), BAD_POLICIES)
def test_a_bad_policy_is_refused_with_exit_2_naming_the_problem(
    runs: dict[str, Path], tmp_path: Path, capsys: Any, text: str, words: list[str]
) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text(text)
    code = main(["compare", str(runs["base"]), str(runs["better"]), "--policy", str(policy),
                 "-o", str(tmp_path / "c.html")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(policy) in err and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "c.html").exists()


def test_a_policy_metric_neither_run_has_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    policy = _policy(tmp_path, text="metrics:\n  - name: rewrad\n")
    code = main(
        [
            "compare",
            str(runs["base"]),
            str(runs["better"]),
            "--policy",
            str(policy),
            "-o",
            str(tmp_path / "c.html"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "rewrad" in err and "did you mean 'reward'" in err


# -- task identity ------------------------------------------------------------------------------
def _ask_other(tasks: set[int]) -> Callable[[dict[str, Any]], None]:
    def edit(rec: dict[str, Any]) -> None:
        if rec["_ng_task_index"] in tasks:
            rec["responses_create_params"]["input"][-1]["content"] = (
                f"another question {rec['_ng_task_index']}"
            )

    return edit


def test_pairs_whose_inputs_differ_are_excluded_and_counted(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    other = make_run(tmp_path / "other", seed=2, lift=0.1, edit=_ask_other({0, 5, 9}))
    (c,) = compare_runs(runs["base"], [other]).candidates
    pairing = c.pairing()
    assert pairing["input_differs"] == 3 and pairing["paired"] == TASKS - 3
    assert {t["task"] for t in pairing["input_differs_tasks"]} == {0, 5, 9}
    assert all(r.n_pairs == TASKS - 3 for r in c.results)
    assert "3 tasks whose inputs differ" in c.verdict["text"]
    main(["compare", str(runs["base"]), str(other), "-o", str(tmp_path / "c.html")])
    assert "3 tasks whose inputs differ" in capsys.readouterr().out


def test_runs_on_different_inputs_under_the_same_indices_are_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    shuffled = make_run(tmp_path / "shuffled", seed=2, edit=_ask_other(set(range(0, TASKS, 2)) | {1, 3}))
    code = main(["compare", str(runs["base"]), str(shuffled), "-o", str(tmp_path / "c.html")])
    err = capsys.readouterr().err
    assert code == 2 and "17 of 30" in err and "inputs differ" in err
    assert not (tmp_path / "c.html").exists()


def test_runs_of_different_benchmarks_are_refused(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    def other_benchmark(rec: dict[str, Any]) -> None:
        rec["_ng_environment_server"] = "math_with_judge_environment_server"
        rec["agent_ref"] = {"name": "math_with_judge_simple_agent"}
        rec["responses_create_params"]["input"][-1]["content"] = f"what is {rec['_ng_task_index']} + 1?"

    math_run = make_run(tmp_path / "math", seed=2, edit=other_benchmark)
    code = main(["compare", str(runs["base"]), str(math_run), "-o", str(tmp_path / "c.html")])
    err = capsys.readouterr().err
    assert code == 2 and "different benchmarks" in err
    assert (
        "math_with_judge_environment_server" in err and "example_single_tool_call_environment_server" in err
    )


# -- three candidates in one page ----------------------------------------------------------------
def test_three_candidates_in_one_page_and_one_table(runs: dict[str, Path], tmp_path: Path) -> None:
    from gym_artifacts.compare.policy import load_policy

    cands = [runs["better"], runs["verbose"], runs["worse"]]
    comparison = compare_runs(runs["base"], cands, policy=load_policy(_policy(tmp_path)))
    page = render_compare_page(comparison)
    assert page.count('<li class="verdict"') == 3
    table = re.search(r'<table id="gate-table">.*?</table>', page, re.S)
    assert table is not None
    rows = re.findall(r"<tr data-candidate=\"(\d)\"", table.group(0))
    assert sorted(set(rows)) == ["0", "1", "2"] and len(rows) == 6  # 3 candidates x 2 metrics
    for verdict in ("PASS", "WARN", "FAIL"):
        assert f'data-verdict="{verdict}"' in page
    data = json.loads(re.search(r'id="compare-data">(.*?)</script>', page, re.S).group(1))
    assert [c["candidate"] for c in data["candidates"]] == ["better/eval", "verbose/eval", "worse/eval"]


# -- any key, any finite value -------------------------------------------------------------------
keys = st.one_of(
    # within 64 bits: the shared JSONL reader (orjson) reads a longer integer as a float
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(min_size=1, max_size=12),
    st.sampled_from(["tâche-1", "任务-3", 2**53 + 1, 2**53 + 2, "1", "</script>", "\u2028"]),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
huge = st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 1e308, -1e308, 5e-324, 0.0])


def _simple_run(path: Path, rows: list[tuple[Any, float, float]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task_id": k, "reward": r, "cost": c}) + "\n" for k, r, c in rows))
    return path


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    task_keys=st.lists(keys, min_size=1, max_size=8, unique_by=lambda k: (type(k), k)),
    values=st.lists(st.tuples(st.one_of(finite, huge), st.one_of(finite, huge)), min_size=16, max_size=16),
)
def test_any_key_any_finite_value_gives_a_page_and_a_verdict(
    task_keys: list[Any], values: list[tuple[float, float]]
) -> None:
    from gym_artifacts.compare.policy import parse_policy

    policy = parse_policy(
        {"metrics": [{"name": "reward"}, {"name": "cost", "direction": "lower_is_better"}]}, "p"
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = _simple_run(Path(tmp, "a", "r.jsonl"), [(k, *values[i]) for i, k in enumerate(task_keys)])
        cand = _simple_run(Path(tmp, "b", "r.jsonl"), [(k, *values[8 + i]) for i, k in enumerate(task_keys)])
        comparison = compare_runs(base, [cand], policy=policy)
        out = comparison.to_json()
        json.dumps(out, allow_nan=False)  # never inf or NaN
        assert _all_finite(out)
        assert out["comparisons"][0]["gate"]["verdict"] in EXIT
        page = render_compare_page(comparison)
        assert "Infinity" not in page and "NaN" not in page
        data = json.loads(re.search(r'id="compare-data">(.*?)</script>', page, re.S).group(1))
        (cdata,) = data["candidates"]
        # every key travels as a string, one row each, and no two keys share one
        assert all(isinstance(r["key"], str) for r in cdata["rows"])
        assert len({r["key"] for r in cdata["rows"]}) == len(task_keys)
        assert set(cdata["samples"]) <= {r["key"] for r in cdata["rows"]}


def test_a_huge_value_in_a_secondary_field_is_not_computable_not_a_crash(tmp_path: Path, capsys: Any) -> None:
    rows_a = [(t, 0.5, 1.7e308 if t % 2 else -1.7e308) for t in range(6)]
    rows_b = [(t, 0.6, -1.7e308 if t % 2 else 1.7e308) for t in range(6)]
    base, cand = _simple_run(tmp_path / "a/r.jsonl", rows_a), _simple_run(tmp_path / "b/r.jsonl", rows_b)
    code = main(["compare", str(base), str(cand), "--json", "-o", str(tmp_path / "c.html")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    cost = next(r for r in out["comparisons"][0]["results"] if r["metric"] == "cost")
    assert cost["p_value"] is None and "not computable" in cost["note"]
    page = (tmp_path / "c.html").read_text()
    assert "Infinity" not in page and "NaN" not in page


# -- the rule of each alternative, against scipy --------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    deltas=st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=40),
    margin=st.sampled_from([0.0, 0.5, 2.0]),
    alternative=st.sampled_from(["two-sided", "greater", "less"]),
    lower_is_better=st.booleans(),
)
def test_each_alternative_decides_as_its_interval_says(
    deltas: list[float], margin: float, alternative: str, lower_is_better: bool
) -> None:
    """pass / regressed / inconclusive exactly as the t interval of the oriented deltas lies
    against ``-margin`` (scipy's, independently), for both directions."""
    import numpy as np
    from scipy import stats

    from gym_artifacts.compare.gate import decide_metric
    from gym_artifacts.compare.policy import MetricRule

    rule = MetricRule("m", "lower_is_better" if lower_is_better else "higher_is_better", margin, alternative)
    out = decide_metric(rule, deltas, 0.05, 0.0, len(deltas))
    oriented = -np.array(deltas) if lower_is_better else np.array(deltas)
    se = stats.sem(oriented)
    if se < 1e-9:
        return  # read from the mean itself (checked in test_compare.py's degenerate cases)
    level = 0.95 if alternative == "two-sided" else 0.90
    low, high = stats.t.interval(level, len(deltas) - 1, loc=oriented.mean(), scale=se)
    if alternative == "two-sided":
        want = "pass" if low > -margin else "regressed" if high < -margin else "inconclusive"
    elif alternative == "greater":
        want = "pass" if low > -margin else "regressed"
    else:
        want = "regressed" if high < -margin else "pass"
    if min(abs(low + margin), abs(high + margin)) > 1e-9:  # not on the boundary itself
        assert out["status"] == want, (out, low, high)
    assert out["difference"] == pytest.approx(-oriented.mean() if lower_is_better else oriented.mean())


def test_a_task_waiver_leaves_the_task_out_and_warns(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    """Task 3 collapses in the candidate (reward 0.4 -> 0): waived, the candidate still gains
    overall: WARN naming task 3; once the waiver expired, the task counts again."""

    def task_3_collapses(rec: dict[str, Any]) -> None:
        if rec["_ng_task_index"] == 3:
            rec["reward"] = 0.0

    cand = make_run(tmp_path / "cand", seed=2, lift=0.1, edit=task_3_collapses)
    text = "metrics:\n  - name: reward\n    margin: 0.05\nwaivers:\n  - task: 3\n    reason: broken grader\n    expires: {}\n"
    code, out = _gate(
        tmp_path, capsys, runs["base"], [cand], _policy(tmp_path, text=text.format("2099-01-01"))
    )
    gate = out["comparisons"][0]["gate"]
    assert gate["verdict"] == "WARN" and code == EXIT["WARN"]
    assert gate["metrics"][0]["n_pairs"] == TASKS - 1
    assert any("task 3 regressed on reward" in r and "broken grader" in r for r in gate["reasons"])
    code, out = _gate(
        tmp_path, capsys, runs["base"], [cand], _policy(tmp_path, "x", text.format("2020-01-01"))
    )
    assert out["comparisons"][0]["gate"]["metrics"][0]["n_pairs"] == TASKS
    assert out["gate"]["expired_waivers"][0]["task"] == 3


def test_markdown_cells_cannot_break_the_table(tmp_path: Path) -> None:
    from gym_artifacts.compare.markdown import cell

    assert cell("a|b\nc<script>") == "a\\|b c&lt;script&gt;"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.dates(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    top=st.fixed_dictionaries({}, optional={k: json_values for k in ("version", "alpha", "min_paired_coverage",
                                                                     "max_input_mismatch", "waivers")}),
    metric=st.fixed_dictionaries({"name": st.text(min_size=1, max_size=5)},
                                 optional={k: json_values | st.sampled_from(["lower_is_better", "tracked", "less"])
                                           for k in ("direction", "margin", "alternative", "tier", "extra")}),
    waiver=st.one_of(st.none(), st.fixed_dictionaries({}, optional={k: json_values for k in
                                                                     ("task", "metric", "reason", "expires", "x")})),
)  # fmt: skip
def test_any_policy_document_is_accepted_or_refused_with_a_policy_error(
    top: dict[str, Any], metric: dict[str, Any], waiver: dict[str, Any] | None
) -> None:
    """Whatever the YAML holds, where it holds it: a Policy whose every value has its type, or a
    PolicyError (exit 2) naming the place; never another exception."""
    import datetime as dt

    from gym_artifacts.compare.policy import Policy, PolicyError, parse_policy

    data: Any = {**top, "metrics": [metric]}
    if waiver is not None:
        data["waivers"] = [waiver]
    try:
        policy = parse_policy(data, "p.yaml")
    except PolicyError as exc:
        assert str(exc).startswith("--policy p.yaml: ")
        return
    assert isinstance(policy, Policy) and 0 < policy.alpha < 0.5
    for rule in policy.metrics:
        assert math.isfinite(rule.margin) and rule.margin >= 0
    for w in policy.waivers:
        assert isinstance(w.expires, dt.date) and w.reason.strip() and (w.task is not None or w.metric)


def test_a_waiver_that_matches_nothing_is_reported(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    """A task waiver for a key no run holds (a task_id text written as a number, a typo) is
    reported, never silently inert."""
    text = (
        "metrics:\n  - name: reward\n    margin: 0.05\nwaivers:\n"
        "  - task: '3'\n    reason: quoted key\n    expires: 2099-01-01\n"
        "  - task: 999\n    reason: no such task\n    expires: 2099-01-01\n"
    )
    code, out = _gate(tmp_path, capsys, runs["base"], [runs["better"]], _policy(tmp_path, text=text))
    unmatched = out["gate"]["unmatched_waivers"]
    assert [w["task"] for w in unmatched] == ["3", 999]
    assert code == EXIT["PASS"]


def test_renamed_environment_servers_with_the_same_inputs_are_compared(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Disjoint environment servers alone do not refuse: when the task inputs match, the runs are
    of the same tasks (a server renamed between NeMo Gym versions)."""

    def renamed(rec: dict[str, Any]) -> None:
        rec["_ng_environment_server"] = "weather_v2_environment_server"

    (c,) = compare_runs(runs["base"], [make_run(tmp_path / "renamed", seed=2, edit=renamed)]).candidates
    assert c.pairing()["paired"] == TASKS


def test_higher_and_lower_read_as_greater_and_less() -> None:
    from gym_artifacts.compare.policy import parse_policy

    policy = parse_policy(
        {"metrics": [{"name": "a", "alternative": "higher"}, {"name": "b", "alternative": "lower"}]}, "p"
    )
    assert [r.alternative for r in policy.metrics] == ["greater", "less"]


def test_a_real_regression_within_the_margin_warns(
    runs: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    """NeMo Gym's epic #1493: WARN when a regression is statistically real but within the
    tolerance. Reward 0.02 lower on every task (margin 0.05): not a FAIL, not a PASS."""
    slightly_worse = make_run(tmp_path / "slightly", seed=1, lift=-0.02)  # the base's noise, shifted
    code, out = _gate(tmp_path, capsys, runs["base"], [slightly_worse], _policy(tmp_path))
    gate = out["comparisons"][0]["gate"]
    reward = next(m for m in gate["metrics"] if m["metric"] == "reward")
    assert reward["status"] == "pass" and reward["worse_within_margin"] is True
    assert gate["verdict"] == "WARN" and code == EXIT["WARN"]
    assert any("within the margin" in r for r in gate["reasons"])
