"""``gym-artifacts compare``: the statistics against an independent computation, and the pairing.

NeMo Gym's method (``nemo_gym/statistical_tests/``, main): each run's per-task ``mean/<metric>``
(its aggregate's ``group_level_metrics``), deltas candidate - base over the tasks both have,
``se = stdev(deltas) / sqrt(n)``, Student t with n - 1 degrees of freedom; two-sided
``p = 2 sf(|mean / se|)``, or one-sided non-inferiority with margin m ``p = sf((mean + m) / se)``;
significant when ``p < alpha``; minimum detectable effect ``(t(1 - tail alpha) + t(0.8)) se``;
no pair, one pair, too little overlap (under half the larger run's tasks) and zero variance are
answered without a t statistic. The tests below compute the same from NeMo Gym's own aggregate
files with scipy's ``ttest_1samp`` and ``t.interval`` (not the code under test).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from gym_artifacts.cli import main
from gym_artifacts.compare import CompareError, compare_runs
from gym_artifacts.compare.stats import paired_test
from gym_artifacts.compare.tasks import read_run_tasks
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.nemo_gym_runs import write_run

CLEAN = NEMO_GYM_FIXTURES / "clean" / "rollouts.jsonl"
WITH_FAILURES = NEMO_GYM_FIXTURES / "with-failures" / "rollouts.jsonl"


def nemo_gym_group_means(rollouts: Path, metric: str) -> dict[int, float]:
    """NeMo Gym's own per-task means: ``mean/<metric>`` of its aggregate's group_level_metrics."""
    aggregate = json.loads(rollouts.with_name(rollouts.stem + "_aggregate_metrics.json").read_text())
    return {
        g["_ng_task_index"]: g[f"mean/{metric}"]
        for entry in aggregate
        for g in entry["group_level_metrics"]
        if f"mean/{metric}" in g
    }


def independent(deltas: list[float], alpha: float, margin: float | None) -> dict[str, float]:
    """The paired test by scipy's one-sample t-test on the deltas."""
    x = np.asarray(deltas, dtype=float)
    n, sem = len(x), stats.sem(x)
    if margin is None:
        p = stats.ttest_1samp(x, 0.0).pvalue
        low, high = stats.t.interval(1 - alpha, n - 1, loc=x.mean(), scale=sem)
        tail = alpha / 2
    else:
        p = stats.ttest_1samp(x, -margin, alternative="greater").pvalue
        low, high = stats.t.interval(1 - 2 * alpha, n - 1, loc=x.mean(), scale=sem)
        tail = alpha
    mde = (stats.t.isf(tail, n - 1) + stats.t.isf(0.2, n - 1)) * sem
    return {"mean": x.mean(), "se": sem, "p": p, "low": low, "high": high, "mde": mde}


def assert_agrees(result: Any, deltas: list[float], alpha: float, margin: float | None) -> None:
    want = independent(deltas, alpha, margin)
    assert result.n_pairs == len(deltas)
    assert result.mean_diff == pytest.approx(want["mean"], rel=1e-9, abs=1e-12)
    assert result.se == pytest.approx(want["se"], rel=1e-9)
    assert result.p_value == pytest.approx(want["p"], rel=1e-6, abs=1e-12)
    assert result.ci_low == pytest.approx(want["low"], rel=1e-9, abs=1e-12)
    assert result.ci_high == pytest.approx(want["high"], rel=1e-9, abs=1e-12)
    assert result.minimum_detectable_effect == pytest.approx(want["mde"], rel=1e-9)
    assert result.significant == (want["p"] < alpha)
    # the interval and the p-value never disagree about significance
    bound = 0.0 if margin is None else -margin
    if result.significant:
        assert result.ci_low > bound or (margin is None and result.ci_high < 0)


spread_deltas = st.lists(
    st.floats(-1, 1, allow_nan=False, allow_subnormal=False), min_size=2, max_size=80
).filter(lambda xs: np.std(xs) > 1e-6)
alphas = st.sampled_from([0.01, 0.05, 0.1, 0.2])
margins = st.one_of(st.none(), st.floats(0, 0.5, allow_nan=False))


@given(deltas=spread_deltas, alpha=alphas, margin=margins)
def test_paired_test_equals_scipy(deltas: list[float], alpha: float, margin: float | None) -> None:
    result = paired_test(deltas, metric="reward", alpha=alpha, margin=margin)
    assert result.framing == ("two-sided" if margin is None else "non-inferiority")
    assert_agrees(result, deltas, alpha, margin)


def test_degenerate_cases_give_no_false_certainty() -> None:
    none = paired_test([], metric="reward")
    assert (none.n_pairs, none.p_value, none.significant) == (
        0,
        None,
        None,
    ) and "nothing to pair" in none.note
    one = paired_test([0.5], metric="reward")
    assert (one.n_pairs, one.mean_diff, one.se, one.p_value) == (1, 0.5, None, None)
    assert "only 1 paired task" in one.note
    # zero variance: read from the mean itself, as NeMo Gym does
    same = paired_test([0.25] * 5, metric="reward")
    assert (same.se, same.p_value, same.significant, same.ci_low, same.ci_high) == (
        0.0,
        0.0,
        True,
        0.25,
        0.25,
    )
    zero = paired_test([0.0] * 5, metric="reward")
    assert (zero.p_value, zero.significant) == (1.0, False)
    assert paired_test([-0.1] * 4, metric="r", margin=0.2).significant is True  # within the margin
    assert paired_test([-0.2] * 4, metric="r", margin=0.2).significant is False  # on it: not shown
    assert paired_test([-0.3] * 4, metric="r", margin=0.2).significant is False
    # rounding noise is not a difference
    assert paired_test([1e-17, -1e-17, 0.0], metric="r").significant is False
    # too little overlap: NeMo Gym main concludes nothing below half of the larger run's tasks
    thin = paired_test([0.1, 0.3, 0.2], metric="r", tasks_in_larger_run=10)
    assert thin.p_value is None and "too little overlap" in thin.note


@pytest.mark.parametrize(
    ("alpha", "margin"),
    [(0.0, None), (1.0, None), (float("nan"), None), (0.05, -0.1), (0.05, float("inf")), (0.5, 0.1)],
)
def test_bad_alpha_or_margin_is_refused(alpha: float, margin: float | None) -> None:
    with pytest.raises(ValueError):
        paired_test([0.1, 0.2], metric="r", alpha=alpha, margin=margin)
    with pytest.raises(CompareError):
        compare_runs(CLEAN, [WITH_FAILURES], alpha=alpha, margin=margin)


@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_per_task_means_are_nemo_gyms_own(name: str) -> None:
    """The per-task collapse equals NeMo Gym 0.7.0's group_level_metrics, every task and metric."""
    rollouts = NEMO_GYM_FIXTURES / name / "rollouts.jsonl"
    tasks = read_run_tasks(rollouts)
    assert tasks.metrics() == ["reward", "input_tokens", "output_tokens", "total_tokens"]
    for metric in tasks.metrics():
        assert tasks.means(metric) == nemo_gym_group_means(rollouts, metric)


@pytest.mark.parametrize("margin", [None, 0.05])
def test_fixture_clean_vs_with_failures(margin: float | None) -> None:
    """Task 4's rollouts all failed in the candidate: counted and listed as failed, not paired,
    never a zero reward; the four paired tasks are equal (zero variance)."""
    comparison = compare_runs(CLEAN, [WITH_FAILURES], margin=margin)
    (c,) = comparison.candidates
    reward = c.results[0]
    want = nemo_gym_group_means(WITH_FAILURES, "reward")
    base = nemo_gym_group_means(CLEAN, "reward")
    deltas = [want[k] - base[k] for k in sorted(want.keys() & base.keys())]
    assert reward.metric == "reward" and reward.n_pairs == len(deltas) == 4
    assert reward.mean_diff == 0.0 and reward.se == 0.0
    # NeMo Gym's zero-variance rule: two-sided not significant; within any margin > 0 non-inferior
    assert reward.significant is (margin is not None)
    pairing = c.pairing()
    assert (pairing["paired"], pairing["only_in_base"], pairing["only_in_candidate"]) == (4, 1, 0)
    assert pairing["only_in_base_tasks"] == [{"task": 4, "base": "scored", "candidate": "failed"}]
    assert pairing["failed_tasks"] == [{"task": 4, "base_failed_rollouts": 0, "candidate_failed_rollouts": 2}]
    row = next(r for r in c.rows if r.key == 4)
    assert (row.base_value, row.candidate_value, row.delta) == (1.0, None, None)
    summary = c.candidate.summary()
    assert (summary["tasks_failed"], summary["rollouts_failed"], summary["coverage"]["failed"]) == (1, 2, 2)
    assert "1 task only in the base" in c.verdict["text"] and "never scored as 0" in c.verdict["text"]
    # and the other way round: the failed task is the base's
    (back,) = compare_runs(WITH_FAILURES, [CLEAN]).candidates
    assert back.pairing()["only_in_candidate_tasks"] == [{"task": 4, "base": "failed", "candidate": "scored"}]


def _write(folder: Path, tasks: int, rewards: dict[int, float], failing: list[int], seed: int) -> Path:
    return write_run(
        folder / "eval.jsonl", tasks=tasks, repeats=2, failing_tasks=failing, seed=seed,
        reward_of=lambda t, r: rewards[t] if r == 0 else rewards[t] / 2,
    )  # fmt: skip


task_rewards = st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=24)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base_rewards=task_rewards,
    cand_rewards=task_rewards,
    base_failing=st.sets(st.integers(0, 23), max_size=4),
    cand_failing=st.sets(st.integers(0, 23), max_size=4),
    margin=st.one_of(st.none(), st.sampled_from([0.0, 0.1])),
)
def test_generated_runs_agree_with_nemo_gym_and_count_every_task(
    base_rewards: list[float],
    cand_rewards: list[float],
    base_failing: set[int],
    cand_failing: set[int],
    margin: float | None,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = _write(
            Path(tmp, "base"), len(base_rewards), dict(enumerate(base_rewards)), sorted(base_failing), 1
        )
        cand = _write(
            Path(tmp, "cand"), len(cand_rewards), dict(enumerate(cand_rewards)), sorted(cand_failing), 2
        )
        (c,) = compare_runs(base, [cand], margin=margin).candidates
        scored_b = {t for t in range(len(base_rewards)) if t not in base_failing}
        scored_c = {t for t in range(len(cand_rewards)) if t not in cand_failing}
        pairing = c.pairing()
        assert pairing["paired"] == len(scored_b & scored_c)
        assert pairing["only_in_base"] == len(scored_b - scored_c)
        assert pairing["only_in_candidate"] == len(scored_c - scored_b)
        assert pairing["in_neither"] == len(
            (set(range(max(len(base_rewards), len(cand_rewards))))) - scored_b - scored_c
        )
        failed = {t for t in base_failing if t < len(base_rewards)} | {
            t for t in cand_failing if t < len(cand_rewards)
        }
        assert {f["task"] for f in pairing["failed_tasks"]} == failed
        assert all(r.delta is None for r in c.rows if r.key in failed)
        for result in c.results:
            b = nemo_gym_group_means(base, result.metric)
            k = nemo_gym_group_means(cand, result.metric)
            deltas = [k[t] - b[t] for t in sorted(b.keys() & k.keys())]
            assert result.n_pairs == len(deltas)
            larger = max(len(b), len(k))
            if not deltas or len(deltas) < 0.5 * larger or len(deltas) == 1:
                assert result.p_value is None
            elif np.std(deltas) * math.sqrt(len(deltas)) < 1e-9:
                assert result.se == 0.0 and result.p_value in (0.0, 1.0)
            else:
                assert_agrees(result, deltas, 0.05, margin)


def test_no_overlap_is_counted_not_tested(tmp_path: Path) -> None:
    """Two runs with no task in common: nothing paired, every task listed on its side."""
    base = _write(tmp_path / "a", 3, {0: 1.0, 1: 0.0, 2: 1.0}, [], 1)
    cand = _write(tmp_path / "b", 3, {0: 1.0, 1: 0.0, 2: 1.0}, [], 1)
    for line_file in (cand,):  # move the candidate's tasks to 100.. (no overlap)
        lines = [json.loads(x) for x in line_file.read_text().splitlines()]
        for rec in lines:
            rec["_ng_task_index"] += 100
        line_file.write_text("".join(json.dumps(r) + "\n" for r in lines))
        line_file.with_name("eval_materialized_inputs.jsonl").unlink()
    (c,) = compare_runs(base, [cand]).candidates
    assert all(r.n_pairs == 0 and r.p_value is None for r in c.results)
    p = c.pairing()
    assert (p["paired"], p["only_in_base"], p["only_in_candidate"]) == (0, 3, 3)
    assert c.verdict["kind"] == "cannot-tell"


def test_one_pair_and_other_task_keys(tmp_path: Path) -> None:
    """Rollouts of another writer are paired by ``task_index`` / ``task_id``; rows with no key are
    counted as unkeyed, never paired."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"task_id": "q1", "reward": 0.5}\n{"reward": 1}\n')
    b.write_text('{"task_id": "q1", "reward": 0.75}\n{"task_id": "q2", "reward": 1}\n')
    (c,) = compare_runs(a, [b]).candidates
    (reward,) = c.results
    assert (reward.n_pairs, reward.mean_diff, reward.p_value) == (1, 0.25, None)
    assert c.candidate.summary()["task_key"] == ["task_id"]
    assert compare_runs(a, [b]).base.summary()["rollouts_unkeyed"] == 1
    assert c.pairing()["only_in_candidate_tasks"] == [{"task": "q2", "base": "absent", "candidate": "scored"}]


def test_unknown_metric_and_missing_run_are_usage_errors(tmp_path: Path, capsys: Any) -> None:
    assert (
        main(["compare", str(CLEAN), str(WITH_FAILURES), "--metric", "rewrd", "-o", str(tmp_path / "c.html")])
        == 2
    )
    assert "neither" in capsys.readouterr().err
    assert main(["compare", str(CLEAN), str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "c.html")]) == 2
    assert "no run at" in capsys.readouterr().err
    assert not (tmp_path / "c.html").exists()


def test_reactor_folder_has_no_task_to_pair(reactor_fixture: Any, tmp_path: Path) -> None:
    folder = reactor_fixture("no-gpu")
    (c,) = compare_runs(CLEAN, [folder]).candidates
    assert c.results == [] and c.verdict["kind"] == "cannot-tell"
    assert "no rollouts" in c.candidate.summary()["note"]


def test_cli_prints_verdict_table_and_page(tmp_path: Path, capsys: Any) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(NEMO_GYM_FIXTURES, runs)
    out = tmp_path / "cmp.html"
    code = main(["compare", str(runs / "clean/rollouts.jsonl"), str(runs / "with-failures/rollouts.jsonl"),
                 "-o", str(out), "--margin", "0.05"])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and out.is_file()
    assert text.splitlines()[0].startswith("with-failures/rollouts vs clean/rollouts on reward: not worse")
    assert "4 tasks paired, 1 only in the base" in text and f"page: {out}" in text
    assert main(["compare", str(runs / "clean/rollouts.jsonl"), str(runs / "with-failures/rollouts.jsonl"),
                 "-o", str(out), "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["framing"] == "two-sided" and data["comparisons"][0]["pairing"]["only_in_base"] == 1
    assert data["comparisons"][0]["results"][0]["metric"] == "reward"


def test_without_scipy_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "scipy", None)
    code = main(["compare", str(CLEAN), str(WITH_FAILURES), "-o", str(tmp_path / "c.html")])
    assert code == 2 and "pip install 'gym-artifacts[compare]'" in capsys.readouterr().err
    assert not (tmp_path / "c.html").exists()


def test_a_task_with_some_failed_rollouts_pairs_on_its_scored_ones(tmp_path: Path) -> None:
    """One of task 0's two rollouts failed: the task's value is its scored rollout's (NeMo Gym's
    group mean), the failure is counted, and the verdict says the task paired on part of it."""
    run = tmp_path / "partly"
    shutil.copytree(NEMO_GYM_FIXTURES / "clean", run)
    lines = (run / "rollouts.jsonl").read_text().splitlines()
    first = next(i for i, x in enumerate(lines) if json.loads(x)["_ng_task_index"] == 0)
    moved = json.loads(lines.pop(first))
    (run / "rollouts.jsonl").write_text("".join(x + "\n" for x in lines))
    failure = {"_ng_failure_class": "agent_run_error", "_ng_failure_message": "boom",
               "_ng_task_index": 0, "_ng_rollout_index": moved["_ng_rollout_index"]}  # fmt: skip
    (run / "rollouts_failures.jsonl").write_text(json.dumps(failure) + "\n")
    (c,) = compare_runs(CLEAN, [run / "rollouts.jsonl"]).candidates
    row = next(r for r in c.rows if r.key == 0)
    assert (row.candidate_state, row.candidate_failed, row.candidate_value, row.delta) == (
        "scored",
        1,
        1.0,
        0.0,
    )
    assert c.pairing()["paired"] == 5 and c.results[0].n_pairs == 5
    assert "1 task paired on their scored rollouts only" in c.verdict["text"]


def test_page_redacts_secrets_of_either_runs_config(tmp_path: Path) -> None:
    """A response that quotes the API key from the candidate's saved config: the page (which
    --log ships to trackers) holds it nowhere."""
    from gym_artifacts.compare.page import write_compare_page

    secret = "sk-canary-" + "7e" * 12
    run = tmp_path / "leaky"
    shutil.copytree(NEMO_GYM_FIXTURES / "clean", run)
    (run / "rollouts_config.yaml").write_text(f"policy_api_key: {secret}\npolicy_model_name: m\n")
    lines = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    for rec in lines:
        rec["response"]["output"][-1]["content"][0]["text"] = f"my key is {secret}"
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    page = write_compare_page(compare_runs(CLEAN, [run / "rollouts.jsonl"]), tmp_path / "c.html")
    text = page.read_text()
    assert secret not in text and "my key is" in text


def test_this_projects_run_with_journal_and_artifacts(quickstart_run: Path, make_run: Any) -> None:
    """The quickstart run (three agents, a config, a journal, an artifacts folder) against a copy
    of itself: every task pairs, every delta is 0."""
    other = make_run("copy")
    comparison = compare_runs(quickstart_run, [other])
    (c,) = comparison.candidates
    assert c.pairing()["paired"] == 75 and c.results[0].metric == "reward"
    assert all(r.n_pairs == 75 and r.mean_diff == 0.0 and r.significant is False for r in c.results)
    assert comparison.base.summary()["rollouts_scored"] == 300


def asked_as_in(source: Path, rollouts: Path) -> None:
    """Give the generated run at ``rollouts`` (and its planned inputs) the questions ``source``
    asked, task by task: the same tasks, as task identity requires."""
    asked = {}
    for line in source.read_text().splitlines():
        rec = json.loads(line)
        asked[rec["_ng_task_index"]] = rec["responses_create_params"]
    for path in (rollouts, rollouts.with_name(rollouts.stem + "_materialized_inputs.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for rec in lines:
            rec["responses_create_params"] = asked[rec["_ng_task_index"]]
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("base_name", ["clean", "with-failures"])
@pytest.mark.parametrize("margin", [None, 0.1])
def test_real_nemo_gym_base_against_a_generated_candidate(
    base_name: str, margin: float | None, tmp_path: Path
) -> None:
    """NeMo Gym 0.7.0's own output as the base, a candidate of the same 5 tasks with other rewards
    and token counts: every metric's test equals scipy's on the per-task means both aggregate
    files hold (NeMo Gym's own for the base)."""
    base = NEMO_GYM_FIXTURES / base_name / "rollouts.jsonl"
    cand = write_run(tmp_path / "cand" / "eval.jsonl", tasks=5, repeats=2, seed=7,
                     reward_of=lambda t, r: [0.5, 1.0, 0.25, 0.75, 1.0][t] - 0.25 * r)  # fmt: skip
    asked_as_in(NEMO_GYM_FIXTURES / "clean" / "rollouts.jsonl", cand)
    (c,) = compare_runs(base, [cand], margin=margin).candidates
    assert [r.metric for r in c.results] == ["reward", "input_tokens", "output_tokens", "total_tokens"]
    for result in c.results:
        b, k = nemo_gym_group_means(base, result.metric), nemo_gym_group_means(cand, result.metric)
        deltas = [k[t] - b[t] for t in sorted(b.keys() & k.keys())]
        assert len(deltas) == (5 if base_name == "clean" else 4)
        assert_agrees(result, deltas, 0.05, margin)
    assert c.pairing()["only_in_candidate"] == (0 if base_name == "clean" else 1)
