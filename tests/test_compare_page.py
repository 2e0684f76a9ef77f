"""The compare page in real headless Chromium: verdict first, forest plot intervals inside their
frames, a task's two responses side by side, hostile text shown as text, no network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.compare import compare_runs
from gym_artifacts.compare.page import write_compare_page
from tests.nemo_gym_runs import write_run
from tests.test_report import SCREENSHOTS, browser, open_report  # noqa: F401 - the shared Chromium fixture

HOSTILE = "</script><script>window.__pwned = 1</script><!-- <script>window.__pwned = 2</script> &amp;"

# Every interval, estimate and reference line of every forest plot against its frame (px).
MARKS = """
() => {
  const out = [];
  for (const chart of document.querySelectorAll('div.chart[data-kind="forest"]')) {
    const frame = document.getElementById(chart.id + '-frame').getBoundingClientRect();
    const marks = chart.querySelectorAll(
      `[id^="${chart.id}-series-"] > path, [id^="${chart.id}-estimate-"] use, [id^="${chart.id}-reference-"] > path`);
    for (const el of marks) {
      const r = el.getBoundingClientRect();
      const owner = el.closest(`[id^="${chart.id}-"]`);
      out.push({chart: chart.id, id: owner.id, left: r.left, right: r.right, top: r.top,
                bottom: r.bottom, frame: {left: frame.left, right: frame.right, top: frame.top, bottom: frame.bottom}});
    }
  }
  return out;
}
"""


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """A base and a better candidate (task 0 the biggest loss, hostile text in its response);
    the candidate's task 4 fails."""
    base_rewards = {t: (0.6 if t == 0 else 0.25 + 0.01 * t) for t in range(20)}
    cand_rewards = {t: (0.3 if t == 0 else 0.45 + 0.03 * (t % 5)) for t in range(20)}
    base = write_run(tmp_path / "base" / "eval.jsonl", tasks=20, repeats=2, seed=1,
                     reward_of=lambda t, r: base_rewards[t])  # fmt: skip
    cand = write_run(tmp_path / "new" / "eval.jsonl", tasks=20, repeats=2, seed=2, failing_tasks=[4],
                     reward_of=lambda t, r: cand_rewards[t])  # fmt: skip
    lines = [json.loads(x) for x in cand.read_text().splitlines()]
    for rec in lines:
        if rec["_ng_task_index"] == 0:
            rec["response"]["output"][-1]["content"][0]["text"] = f"candidate says: {HOSTILE}"
    cand.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return base, cand


def response_of(rollouts: Path, task: int) -> str:
    """The assistant text of a task's first rollout, read straight from the file."""
    for line in rollouts.read_text().splitlines():
        rec = json.loads(line)
        if rec["_ng_task_index"] == task:
            return rec["response"]["output"][-1]["content"][0]["text"]
    raise AssertionError(task)


@pytest.mark.slow
def test_compare_page_in_chromium(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    base, cand = _runs(tmp_path)
    comparison = compare_runs(base, [cand])
    page_path = write_compare_page(comparison, tmp_path / "compare.html")
    raw = page_path.read_text()
    assert HOSTILE not in raw and "<!-- <script>" not in raw  # escaped in the embedded data
    opened = open_report(browser, page_path)
    page = opened.page
    assert opened.errors == []
    assert [r for r in opened.requests if not r.startswith(("file://", "data:"))] == []
    assert page.evaluate("window.__pwned") is None

    # the verdict comes first and says what the comparison says
    first = page.eval_on_selector("main > section", "s => s.id")
    assert first == "verdict"
    verdict = page.locator("li.verdict").first
    assert verdict.get_attribute("data-kind") == "higher"
    assert verdict.inner_text().strip() == comparison.candidates[0].verdict["text"]
    assert "significantly higher" in verdict.inner_text()

    # every interval, estimate and reference line lies inside its frame; intervals have width
    marks = page.evaluate(MARKS)
    forest = page.locator('div.chart[data-kind="forest"]').count()
    assert forest == len(comparison.candidates[0].results) == 4
    assert sum(1 for m in marks if "-series-" in m["id"]) == 4  # one interval per metric
    assert sum(1 for m in marks if "-reference-" in m["id"]) == 4
    assert sum(1 for m in marks if "-estimate-" in m["id"]) == 4
    for m in marks:
        f = m["frame"]
        assert f["left"] - 1 <= m["left"] and m["right"] <= f["right"] + 1, m
        assert f["top"] - 1 <= m["top"] and m["bottom"] <= f["bottom"] + 1, m
        if "-series-" in m["id"]:
            assert m["right"] - m["left"] > 5, m
    # the reward interval lies right of the zero line (a significant gain), as the numbers say
    reward_chart = page.locator('div.chart[data-kind="forest"]').first.get_attribute("id")
    interval = next(m for m in marks if m["id"] == f"{reward_chart}-series-0")
    zero = next(m for m in marks if m["id"] == f"{reward_chart}-reference-0")
    assert interval["left"] > zero["right"]

    # the biggest loss (task 0) is chosen first: its two responses side by side
    assert page.locator("#losses-table tbody tr").first.locator("td").first.inner_text() == "0"
    base_box = page.locator("#base-side").bounding_box()
    cand_box = page.locator("#candidate-side").bounding_box()
    assert abs(base_box["y"] - cand_box["y"]) < 2 and base_box["x"] + base_box["width"] <= cand_box["x"]
    base_text = page.locator("#base-side pre.response").first.inner_text()
    cand_text = page.locator("#candidate-side pre.response").first.inner_text()
    assert base_text == response_of(base, 0)
    assert cand_text == response_of(cand, 0) == f"candidate says: {HOSTILE}"  # shown as text
    # the conversation, the tool call and what the tool returned, on both sides
    for side in ("#base-side", "#candidate-side"):
        assert page.locator(f"{side} pre.conversation").first.inner_text().startswith("developer: You are")
        assert page.locator(f"{side} pre.tool-calls").first.inner_text().startswith("get_weather(")
        assert "weather_description" in page.locator(f"{side} pre.tool-results").first.inner_text()

    # choosing the failed task shows the failure, never a reward of 0
    page.select_option("#task-select", "4")
    cand_side = page.locator("#candidate-side").inner_text()
    assert "FAILED" in cand_side and "agent_run_error" in cand_side and "reward 0" not in cand_side
    assert "reward" in page.locator("#base-side").inner_text()
    row = page.locator("#tasks-table tbody tr[data-task='4']").locator("td").all_inner_texts()
    assert row[1:3] == ["scored", "failed"] and row[4] == "-" and row[5] == "-"

    # clicking a row of the wins table shows that task
    win = page.locator("#wins-table tbody tr").first
    key = win.get_attribute("data-task")
    win.click()
    assert page.locator("#task-view").get_attribute("data-task") == key
    assert page.locator("#candidate-side pre.response").first.inner_text() == response_of(
        cand, json.loads(key)
    )

    # coverage of each run
    coverage = page.inner_text("#coverage")
    assert "38 of 40 planned rollouts scored (2 failed)" in coverage and "40 of 40" in coverage
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=True)
    page.close()


def _outside(page: Any) -> list[dict[str, Any]]:
    out = []
    for m in page.evaluate(MARKS):
        f = m["frame"]
        if (
            min(
                m["left"] - f["left"], f["right"] - m["right"], m["top"] - f["top"], f["bottom"] - m["bottom"]
            )
            < -1
        ):
            out.append(m)
    return out


def test_forest_plots_of_awkward_intervals_stay_in_frame(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Huge, tiny, zero-width, one-sided and missing intervals, and a margin far from the data:
    every mark inside its frame; a mark pushed out is caught."""
    from gym_artifacts.report import charts

    rows = [
        ("huge", 1e9, -1e9, 3e9), ("tiny", 1e-12, 0.0, 2e-12), ("zero width", 0.25, 0.25, 0.25),
        ("dot only", -0.5, None, None), ("no estimate", None, None, None), ("negative", -3.0, -4.0, -2.0),
    ]  # fmt: skip
    parts = [charts.forest_plot(rows[i : i + 2], title=f"case {i}", x_label="d", references={"zero": 0.0,
             "- margin": -50.0}) for i in range(0, len(rows), 2)]  # fmt: skip
    parts.append(charts.forest_plot(rows, title="all", x_label="d", references={"zero": 0.0}))
    assert charts.forest_plot([("none", None, None, None)], title="t", x_label="d") == ""
    html = tmp_path / "forest.html"
    html.write_text(f"<!doctype html><html><body>{''.join(parts)}</body></html>")
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(html.as_uri())
    assert len(page.evaluate(MARKS)) >= 12 and _outside(page) == []
    broken = parts[-1].replace('-series-0">', '-series-0" transform="translate(900 0)">', 1)
    assert broken != parts[-1]
    html.write_text(f"<!doctype html><html><body>{broken}</body></html>")
    page.goto(html.as_uri())
    assert _outside(page)
    page.close()


def test_hostile_names_are_text(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """A run folder, task keys and a metric named like markup (and matplotlib's ``$`` math) are
    drawn as the text they are: nothing runs, no element is injected."""
    folder = tmp_path / "<img src=x onerror=window.__pwned=3>$a$"
    folder.mkdir()
    metric = "s$c$ore</script><!--"
    rows_a = [("<b>t1</b>", 0.5, 1), ("t2", 0.2, 2), ("t3", 0.1, 3)]
    rows_b = [("<b>t1</b>", 0.7, 1.5), ("t2", 0.3, 2), ("t3", 0.6, 3.5)]
    for path, rows in ((tmp_path / "a.jsonl", rows_a), (folder / "eval.jsonl", rows_b)):
        path.write_text(
            "".join(json.dumps({"task_id": t, "reward": r, metric: m}) + "\n" for t, r, m in rows)
        )
    comparison = compare_runs(tmp_path / "a.jsonl", [folder / "eval.jsonl"])
    assert [r.metric for r in comparison.candidates[0].results] == ["reward", metric]
    opened = open_report(browser, write_compare_page(comparison, tmp_path / "c.html"))
    page = opened.page
    assert opened.errors == [] and page.evaluate("window.__pwned") is None
    assert page.locator("main img, main b").count() == 0
    svg_text = page.eval_on_selector_all("div.chart svg text", "ts => ts.map(t => t.textContent).join(' ')")
    assert f"{metric}: candidate - base" in svg_text and "$a$/eval" in svg_text
    assert "task <b>t1</b>" in page.locator("#task-select option").all_inner_texts()  # as text
    page.close()


ODD_KEYS: list[Any] = ["tâche-1", "任务-3", 2**53 + 1, 2**53 + 2, 7]
# candidate - base per key: 2**53 + 2 is the worst regression, then "任务-3"; 2**53 + 1 improves
ODD_DELTAS = {"tâche-1": 0.1, "任务-3": -0.3, 2**53 + 1: 0.4, 2**53 + 2: -0.5, 7: 0.0}


def _odd_run(path: Path, side: str, delta: dict[Any, float]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for key in ODD_KEYS:
        for repeat in range(2):
            lines.append({
                "task_id": key, "repeat": repeat, "reward": 0.5 + delta.get(key, 0.0),
                "responses_create_params": {"input": [{"role": "user", "content": f"question {key}"}],
                                            "tools": [{"type": "function", "name": "lookup"}]},
                "response": {"output": [
                    {"type": "function_call", "name": "lookup", "arguments": json.dumps({"key": str(key)}, ensure_ascii=False),
                     "call_id": f"c{repeat}"},
                    {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": f"{side} answers {key}"}]}]},
            })  # fmt: skip
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def test_any_task_key_shows_its_own_rollouts_worst_regression_first(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Non-ASCII keys and integer keys above 2**53 (equal as JavaScript numbers) each show their
    own two rollouts side by side; the per-task view lists the worst regression first."""
    base = _odd_run(tmp_path / "base" / "r.jsonl", "base", {})
    cand = _odd_run(tmp_path / "cand" / "r.jsonl", "candidate", ODD_DELTAS)
    comparison = compare_runs(base, [cand], metrics=["reward"])
    opened = open_report(browser, write_compare_page(comparison, tmp_path / "keys.html"))
    page = opened.page
    assert opened.errors == []
    first = page.locator("#tasks-table tbody tr").first.locator("td").first.inner_text()
    assert first == str(2**53 + 2)  # the worst regression first
    order = page.locator("#tasks-table tbody tr").evaluate_all("rs => rs.map(r => r.cells[0].textContent)")
    assert order == [str(k) for k in sorted(ODD_KEYS, key=lambda k: ODD_DELTAS[k])]
    # the view opens on the worst task
    assert page.locator("#candidate-side pre.response").first.inner_text() == f"candidate answers {2**53 + 2}"
    for key in ODD_KEYS:
        page.select_option("#task-select", label=f"task {key}")
        for side, box in (("base", "#base-side"), ("candidate", "#candidate-side")):
            texts = page.locator(f"{box} pre.response").all_inner_texts()
            assert texts == [f"{side} answers {key}"] * 2, (key, side, texts)
            assert page.locator(f"{box} pre.conversation").first.inner_text().endswith(f"question {key}")
            assert f'"key": "{key}"' in page.locator(f"{box} pre.tool-calls").first.inner_text()
        assert (
            page.locator("#candidate-side .sample-head")
            .first.inner_text()
            .startswith(f"reward {0.5 + ODD_DELTAS[key]:g}")
        )
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "compare-odd-keys.png"), full_page=True)
    page.close()


@pytest.mark.slow
def test_three_candidates_under_a_policy_in_one_page(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Three candidates against one base: three verdicts, one gate table (a row per candidate and
    metric), and the task view follows the chosen candidate."""
    from gym_artifacts.compare.policy import load_policy
    from tests.test_compare_gate import POLICY, make_run

    base = make_run(tmp_path / "base", seed=1)
    cands = [make_run(tmp_path / "better", seed=2, lift=0.1, tokens=-30),
             make_run(tmp_path / "verbose", seed=3, lift=0.1, tokens=40),
             make_run(tmp_path / "worse", seed=4, lift=-0.2)]  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(expires="2099-12-31"))
    comparison = compare_runs(base, cands, policy=load_policy(policy))
    opened = open_report(browser, write_compare_page(comparison, tmp_path / "gate.html"))
    page = opened.page
    assert opened.errors == []
    verdicts = page.locator("li.verdict").evaluate_all("ls => ls.map(l => l.dataset.verdict)")
    assert verdicts == ["PASS", "WARN", "FAIL"]
    rows = page.locator("#gate-table tbody tr")
    assert rows.count() == 6
    cells = rows.evaluate_all(
        "rs => rs.map(r => [r.cells[0].textContent, r.cells[1].textContent, r.cells[6].textContent])"
    )
    assert cells[3] == ["verbose/eval", "WARN", "waived"] and cells[4] == ["worse/eval", "FAIL", "regressed"]
    assert page.locator(".gate-verdict").get_attribute("data-verdict") == "FAIL"
    # the task view follows the chosen candidate: its worst task first
    page.select_option("#candidate-select", "2")
    worst = comparison.candidates[2]
    first = page.locator("#tasks-table tbody tr").first.locator("td").first.inner_text()
    assert first == str(min((r for r in worst.rows if r.delta is not None), key=lambda r: r.delta).key)
    assert page.locator("#candidate-title").inner_text() == "candidate: worse/eval"
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "compare-gate-three-candidates.png"), full_page=True)
    page.close()
