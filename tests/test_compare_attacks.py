"""``compare --policy`` / ``--markdown`` / ``--log`` attacked as a hostile or unlucky user would:
odd YAML (aliases, duplicate keys, huge numbers, timestamps, a file that never ends), waivers
that would lower the coverage, a Markdown summary fed thousands of waivers or names holding
Markdown, candidates that share a name, and the docs' CI example run as written."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts.cli import main
from gym_artifacts.compare import compare_runs
from gym_artifacts.compare.policy import PolicyError, load_policy
from tests.processes import run_bounded
from tests.test_compare_gate import make_run

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "compare.md"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("attack")
    return {
        "base": make_run(root / "base", seed=1),
        "new": make_run(root / "new", seed=2, lift=0.1, tokens=40),
        "root": root,
    }


def _write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    message = str(info.value)
    assert message.startswith(f"--policy {path}"), message
    for word in words:
        assert word in message, (word, message)
    return message


# -- odd YAML ------------------------------------------------------------------------------------
def test_nested_aliases_are_refused_quickly_with_a_short_message(tmp_path: Path) -> None:
    """A 300-byte file of aliases (the "billion laughs") under a key that wants a number: the
    message names the place in a few words; it never spells out millions of values."""
    parts, prev = ["&a [x, x, x, x, x, x, x, x, x]"], "a"
    for name in "bcdefg":
        parts.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
        prev = name
    policy = _write(tmp_path, "metrics:\n  - name: reward\nalpha: [" + ", ".join(parts) + "]\n")
    start = time.monotonic()
    message = _refused(policy, "alpha", "number")
    assert len(message) < 1000, len(message)
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("where", ["alpha", "margin", "min_paired_coverage"])
def test_an_integer_past_float64_is_refused_not_a_crash(tmp_path: Path, where: str) -> None:
    huge = "9" * 400
    text = (
        f"metrics:\n  - name: reward\n    margin: {huge}\n"
        if where == "margin"
        else f"{where}: {huge}\nmetrics:\n  - name: reward\n"
    )
    message = _refused(_write(tmp_path, text), where)
    assert len(message) < 400


def test_an_expiry_with_a_time_is_refused_naming_expires(
    pair: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    """``!!timestamp 2027-01-31 10:00:00+05:00`` is a datetime, which Python cannot compare with
    the day: refused as a policy error (exit 2), never a TypeError at the comparison."""
    policy = _write(
        tmp_path,
        "metrics:\n  - name: reward\nwaivers:\n  - metric: reward\n    reason: x\n"
        "    expires: !!timestamp 2027-01-31 10:00:00+05:00\n",
    )
    _refused(policy, "waivers[0].expires", "YYYY-MM-DD")
    code = main(["compare", str(pair["base"]), str(pair["new"]), "--policy", str(policy),
                 "-o", str(tmp_path / "c.html")])  # fmt: skip
    assert code == 2 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("metrics:\n  - name: reward\n    margin: 0.02\n    margin: 50\n", "metrics[0]"),
        ("metrics:\n  - name: reward\nmetrics:\n  - name: output_tokens\n", "metrics"),
        ("alpha: 0.05\nalpha: 0.4\nmetrics:\n  - name: reward\n", "alpha"),
    ],
)
def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path: Path, text: str, where: str) -> None:
    """YAML loaders keep the last of two equal keys: a policy whose second ``margin`` silently
    replaces the first decides with a margin its reader never saw."""
    _refused(_write(tmp_path, text), "twice")


def test_exponent_floats_without_a_dot_are_numbers(tmp_path: Path) -> None:
    """``alpha: 1e-3`` and ``margin: 5e-3`` are numbers (YAML 1.1's resolver alone wants a dot)."""
    policy = load_policy(_write(tmp_path, "alpha: 1e-3\nmetrics:\n  - name: reward\n    margin: 5e-3\n"))
    assert policy.alpha == 1e-3 and policy.metrics[0].margin == 5e-3


def test_a_policy_file_past_the_size_limit_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = _write(tmp_path, "metrics:\n  - name: reward\n# " + "x" * 3_000_000 + "\n")
    _refused(big, "too large")
    if Path("/dev/zero").exists():  # a file that never ends: refused, not read into memory
        _refused(Path("/dev/zero"), "too large")


# -- waivers and coverage ------------------------------------------------------------------------
def test_a_task_waiver_never_turns_a_pass_into_inconclusive(pair: dict[str, Path], tmp_path: Path) -> None:
    """Waived tasks are left out on purpose: they count as covered, so a waiver can only make the
    verdict more lenient (coverage 1.0 and one waived task that improved: still PASS)."""
    text = "min_paired_coverage: 1.0\nmetrics:\n  - name: reward\n    margin: 0.05\n"
    plain = compare_runs(pair["base"], [pair["new"]], policy=load_policy(_write(tmp_path, text, "a.yaml")))
    assert plain.gate()["verdict"] == "PASS"
    waived = text + "waivers:\n  - task: 3\n    reason: broken grader\n    expires: 2099-01-01\n"
    comparison = compare_runs(
        pair["base"], [pair["new"]], policy=load_policy(_write(tmp_path, waived, "b.yaml"))
    )
    reward = comparison.candidates[0].gate["metrics"][0]
    assert reward["n_pairs"] == 29
    assert comparison.gate()["verdict"] == "PASS", reward["reason"]


# -- the Markdown summary --------------------------------------------------------------------------
def test_the_markdown_stays_under_githubs_limit_with_thousands_of_waivers(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    """Every part of the comment is bounded, not the table alone: 5,000 waivers that match no
    task (and 5,000 expired ones) still give a comment GitHub accepts, saying what was left out."""
    from gym_artifacts.compare.markdown import render_markdown

    waivers = "".join(
        f"  - task: {1000 + i}\n    reason: known regression number {i} of a long list\n"
        f"    expires: {'2020-01-01' if i % 2 else '2099-01-01'}\n"
        for i in range(10_000)
    )
    policy = load_policy(
        _write(tmp_path, "metrics:\n  - name: reward\n    margin: 0.05\nwaivers:\n" + waivers)
    )
    text = render_markdown(compare_runs(pair["base"], [pair["new"]], policy=policy))
    assert len(text) < 65_536, len(text)
    assert "more" in text.split("Expired waivers")[1]


def _table_cells(html_text: str) -> list[list[str]]:
    body = html_text.split("<tbody>")[1].split("</tbody>")[0]
    return [re.findall(r"<td>(.*?)</td>", row, re.S) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


@pytest.mark.parametrize(
    "name",
    [
        "![pixel](https://tracker.example/p.png)",
        "[approve this PR](https://evil.example/)",
        "<img src=x onerror=alert(1)>",
        "a\\|b",
        "x|y\nz",
        "`code|span`",
        "**bold** _em_ ~~gone~~",
    ],
)
def test_markdown_cells_hold_text_never_links_images_or_html(name: str) -> None:
    """A name with Markdown or HTML in it, in a GFM table (markdown-it's, as GitHub's): one cell,
    its text intact, and no element but the cell itself."""
    markdown_it = pytest.importorskip("markdown_it")
    from gym_artifacts.compare.markdown import cell

    md = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])
    rendered = md.render(f"| a | b |\n|---|---|\n| {cell(name)} | last |\n")
    (row,) = _table_cells(rendered)
    assert len(row) == 2 and row[1] == "last", rendered
    assert "<" not in row[0].replace("&lt;", ""), rendered  # no element inside the cell
    import html

    assert html.unescape(row[0]) == name.replace("\n", " "), rendered


# -- candidates sharing a name ------------------------------------------------------------------------
def test_candidates_that_share_a_name_stay_apart(pair: dict[str, Path], tmp_path: Path) -> None:
    """The same run twice, and two runs whose folder and stem agree (``a/new/eval``, ``b/new/eval``):
    each candidate keeps a name of its own in the tables, the Markdown and the trackers' metrics
    (one MLflow metric key per candidate, none overwritten)."""
    from gym_artifacts.compare.log import _metrics, results_table

    other = make_run(tmp_path / "b" / "new", seed=3, lift=0.1)
    comparison = compare_runs(pair["base"], [pair["new"], pair["new"], other], metrics=["reward"])
    names = [c.candidate.name for c in comparison.candidates]
    assert len(set(names)) == 3, names
    metrics = _metrics(comparison)
    assert len([k for k in metrics if k.endswith("/reward/mean_diff")]) == 3, sorted(metrics)
    assert len({row[0] for row in results_table(comparison)[1]}) == 3


# -- the docs' CI example, run as written ------------------------------------------------------------
def _doc_block(after: str, lang: str) -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(after)
    match = re.search(rf"```{lang}\n(.*?)```", text[start:], re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.slow
@pytest.mark.parametrize(("lift", "want_code", "job_fails"), [(0.1, 3, False), (-0.2, 5, True)])
def test_the_ci_example_runs_as_documented(
    tmp_path: Path, lift: float, want_code: int, job_fails: bool
) -> None:
    """docs/compare.md's policy and GitHub Actions steps, run by bash as the runner would: the
    gate step records the documented exit code, the summary exists for the comment step, and the
    last step fails the job on FAIL only."""
    import yaml

    workflow = yaml.safe_load(_doc_block("## In CI", "yaml"))
    steps = {s.get("name"): s for s in workflow["jobs"]["gate"]["steps"]}
    gate_step, last = steps["compare against the policy"], steps["fail on FAIL (5) or an error (1, 2)"]
    (tmp_path / "release-policy.yaml").write_text(_doc_block("## The policy: a release gate", "yaml"))
    make_run(tmp_path / "runs" / "base", seed=1)
    make_run(tmp_path / "runs" / "pr", seed=2, lift=lift, tokens=40)
    outputs = tmp_path / "github_output"
    outputs.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(outputs),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    # GitHub runs `run:` with `bash -e {0}`
    run_bounded(["bash", "-e", "-c", gate_step["run"]], cwd=tmp_path, env=env, check=True, timeout=120)
    recorded = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert recorded == {"code": str(want_code)}
    assert (tmp_path / "summary.md").stat().st_size > 0 and (tmp_path / "compare.html").is_file()
    script = last["run"].replace("${{ steps.gate.outputs.code }}", recorded["code"])
    job = run_bounded(["bash", "-e", "-c", script], cwd=tmp_path, env=env, timeout=60)
    assert (job.returncode != 0) == job_fails
    assert json.loads(json.dumps(workflow))  # plain data: the workflow is valid YAML as written


# -- Ctrl-C ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["compare", "log"])
def test_ctrl_c_ends_with_130_and_one_line_never_a_traceback(
    pair: dict[str, Path], tmp_path: Path, capsys: Any, monkeypatch: Any, where: str
) -> None:
    """Ctrl-C while the runs are read, or while the trackers are sent to: exit 130 (as ``export``)
    with one line saying what was cut; once the comparison was made, it is still printed."""
    import gym_artifacts.compare.comparison as comparison_module
    import gym_artifacts.compare.log as log_module

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(comparison_module if where == "compare" else log_module,
                        "compare_runs" if where == "compare" else "log_comparison", interrupted)  # fmt: skip
    code = main(["compare", str(pair["base"]), str(pair["new"]), "-o", str(tmp_path / "c.html"), "--log"])
    out, err = capsys.readouterr()
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    assert ("page: " in out) == (where == "log")


def test_a_tracked_metric_that_cannot_be_tested_is_not_a_silent_pass(tmp_path: Path) -> None:
    """Every rollout of the candidate failed: nothing pairs. A policy of tracked metrics only must
    not PASS on no evidence at all: the untested tracked metric is a WARN naming why."""
    from tests.nemo_gym_runs import write_run

    base = write_run(tmp_path / "base" / "eval.jsonl", tasks=6, repeats=2)
    failed = write_run(tmp_path / "failed" / "eval.jsonl", tasks=6, repeats=2, failing_tasks=range(6))
    policy = load_policy(_write(tmp_path, "metrics:\n  - name: reward\n    tier: tracked\n    margin: 0.1\n"))
    gate = compare_runs(base, [failed], policy=policy).candidates[0].gate
    assert gate["metrics"][0]["status"] == "inconclusive"
    assert gate["verdict"] == "WARN", gate["reasons"]
    assert any("reward" in r and "no task has it in both runs" in r for r in gate["reasons"])


# -- huge runs: the page, the summary and the JSON stay bounded -------------------------------------
def _many(path: Path, tasks: int, repeats: int, lift: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in range(tasks):
            for r in range(repeats):
                reward = ((t * 7919 + r * 104729) % 1000) / 1000 + lift
                f.write(json.dumps({"task_id": f"task-{t}", "reward": reward, "tokens": 100 + t % 17}) + "\n")
    return path


@pytest.mark.slow
def test_fifty_thousand_rollouts_give_a_page_and_summary_of_bounded_size(tmp_path: Path) -> None:
    """12,500 tasks x 4 repeats (50,000 rollouts) against 6,250 x 4: the page, the Markdown and
    the JSON are about the same size for both (the task rows past the page's limit are counted,
    not embedded), and the verdict is made."""
    from gym_artifacts.compare.markdown import render_markdown
    from gym_artifacts.compare.page import render_compare_page

    sizes = []
    policy = load_policy(_write(tmp_path, "metrics:\n  - name: reward\n    margin: 0.01\n"))
    for tasks in (6_250, 12_500):
        base = _many(tmp_path / f"b{tasks}" / "r.jsonl", tasks, 4, 0.0)
        cand = _many(tmp_path / f"c{tasks}" / "r.jsonl", tasks, 4, 0.02)
        comparison = compare_runs(base, [cand], policy=policy)
        assert comparison.gate()["verdict"] == "PASS"
        sizes.append((len(render_compare_page(comparison)), len(render_markdown(comparison)),
                      len(json.dumps(comparison.to_json()))))  # fmt: skip
    (page_a, md_a, json_a), (page_b, md_b, json_b) = sizes
    assert page_b < 1.1 * page_a and page_b < 8_000_000, sizes
    assert md_b < 1.1 * md_a and json_b < 1.1 * json_a, sizes


@pytest.mark.parametrize(
    ("written", "read"), [("017", 17), ("0x11", "0x11"), ("1:30", "1:30"), ("1_7", "1_7")]
)
def test_a_task_key_reads_as_written_never_as_octal_or_base_60(
    tmp_path: Path, written: str, read: Any
) -> None:
    """YAML 1.1 reads ``017`` as 15 and ``1:30`` as 90: a waiver for task 017 would silently waive
    task 15. Integers are decimal (YAML 1.2); other spellings stay text, which names no integer
    task (reported as matching nothing)."""
    policy = load_policy(
        _write(
            tmp_path,
            f"metrics:\n  - name: reward\nwaivers:\n  - task: {written}\n    reason: x\n"
            "    expires: 2099-01-01\n",
        )
    )
    assert policy.waivers[0].task == read


PIECES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=3) | st.sampled_from(
    [*"|\\`*_[]()<>!&#~@:\n\r\t-+=.", "&amp;", "&#124;", "<!--", "](x)", "\\|", "https://x.example"]
)


@settings(max_examples=300, deadline=None)
@given(name=st.lists(PIECES, max_size=12).map("".join))
def test_any_name_is_one_cell_of_its_own_text(name: str) -> None:
    """Whatever a run or metric name holds, in a GFM table (markdown-it's): one cell whose text is
    the name (line breaks as spaces, outer spaces trimmed as a table trims them), no element in it."""
    markdown_it = pytest.importorskip("markdown_it")
    import html

    from gym_artifacts.compare.markdown import cell

    md = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])
    rendered = md.render(f"| a | b |\n|---|---|\n| {cell(name)} | last |\n")
    (row,) = _table_cells(rendered)
    assert len(row) == 2 and row[1] == "last", rendered
    assert "<" not in row[0].replace("&lt;", ""), rendered
    want = " ".join(name.replace("\r", " ").replace("\n", " ").split())
    assert " ".join(html.unescape(row[0]).split()) == want, rendered
