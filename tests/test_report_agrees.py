"""The report agrees with what the backends show (issue 39): the params an export logs for a run
without a saved config, the failed rollouts with their planned input, the eval's times from the
journal or the rollouts when no session recorded them. Read from the built HTML."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gym_artifacts.report import build_report
from tests.fixture_paths import NEMO_GYM_FIXTURES


def _with_failures(tmp_path: Path) -> Path:
    shutil.copytree(NEMO_GYM_FIXTURES / "with-failures", tmp_path / "with-failures")
    return tmp_path / "with-failures" / "rollouts.jsonl"


def test_failed_rollouts_show_their_planned_prompt_and_the_params_the_export_logs(tmp_path: Path) -> None:
    run = _with_failures(tmp_path)
    html = Path(build_report(run, tmp_path / "r.html")).read_text()
    planned = [json.loads(x) for x in run.with_name("rollouts_materialized_inputs.jsonl").read_text().splitlines()]
    task4 = next(p for p in planned if p["_ng_task_index"] == 4)
    prompt = task4["responses_create_params"]["input"][-1]["content"]
    scored = run.read_text()
    assert prompt not in scored  # task 4 only failed: its prompt can come from the plan alone
    assert html.count(json.dumps(prompt)[1:-1]) >= 2  # both failed rows show it
    assert "exports with no params" not in html
    assert "example_single_tool_call_simple_agent" in html and "num_repeats" in html


def test_times_come_from_the_journal_or_the_rollouts_when_no_session_recorded_them(
    quickstart_run: Path, tmp_path: Path
) -> None:
    (quickstart_run.with_name("eval_artifacts") / "session_times.json").unlink()
    html = Path(build_report(quickstart_run, tmp_path / "q.html")).read_text()
    assert "No session times were recorded." not in html
    assert "journal" in html
    run = _with_failures(tmp_path)
    html = Path(build_report(run, tmp_path / "w.html")).read_text()
    assert "No session times were recorded." not in html and "from the rollouts" in html
