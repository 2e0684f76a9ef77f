"""Runs as users have them: torn last line, copied without times, missing, stale by content."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.cli import main
from gym_artifacts.core.flags import PARTIAL_OVERRIDE_FLAG, STALE_OVERRIDE_FLAG
from gym_artifacts.run.torn import partial_last_line
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

TORN = b'{"task_index": 999, "agent_ref": {"name": "arithmetic_agent"}, "rew'


def _tear(run: Path) -> int:
    """Append a half-written rollout (an eval killed mid-write); returns its size."""
    with open(run, "ab") as fh:
        fh.write(TORN)
    agg = run.with_name("eval_aggregate_metrics.json")
    agg.touch()  # the aggregate is not what is wrong here
    return len(TORN)


def _local_store(tmp_path: Path) -> Path:
    return tmp_path / "store" / "tests"


def test_torn_line_status_and_report_work_and_say_so(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = _tear(quickstart_run)
    assert main(["status", str(quickstart_run)]) == 0
    out = capsys.readouterr().out
    assert f"the last line is partial ({n} bytes): the writer was interrupted" in out
    assert main(["status", str(quickstart_run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partial_last_line_bytes"] == n
    assert PARTIAL_OVERRIDE_FLAG in report["missing_for_export"]
    dest = quickstart_run.with_name("r.html")
    assert main(["report", str(quickstart_run), "-o", str(dest)]) == 0
    page = dest.read_text()
    assert f"the last line is partial ({n} bytes)" in page
    assert "300 rollouts" in page


@pytest.mark.slow
def test_torn_line_export_refuses_then_option_exports_complete_lines(
    quickstart_run: Path, local_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete = quickstart_run.read_bytes()
    n = _tear(quickstart_run)
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 1
    [refused] = json.loads(capsys.readouterr().out)
    assert refused["status"] == "FAILED"
    assert f"the last line is partial ({n} bytes): the writer was interrupted" in refused["reason"]
    assert PARTIAL_OVERRIDE_FLAG in refused["reason"]
    assert not _local_store(tmp_path).exists()
    args = ["export", str(quickstart_run), "-c", str(local_config), "--json", PARTIAL_OVERRIDE_FLAG]
    assert main(args) == 0
    [done] = json.loads(capsys.readouterr().out)
    assert done["status"] == "EXPORTED" and done["rows"] == 300
    [run_dir] = _local_store(tmp_path).iterdir()
    assert (run_dir / "rollouts.jsonl").read_bytes() == complete  # the torn bytes never left
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["omitted_partial_lines"] == 1 and run_json["omitted_partial_line_bytes"] == n
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["omitted_partial_line_bytes"] == n


def test_partial_last_line_tells_a_missing_newline_from_a_torn_record(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert partial_last_line(f) is None  # complete, only the final newline is missing
    f.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    assert partial_last_line(f) is None
    f.write_bytes(b'{"a": 1}\n' + b'{"big": "' + b"x" * 300_000)  # a torn line longer than a block
    torn = partial_last_line(f)
    assert torn is not None and torn.complete_bytes == 9 and torn.partial_bytes == 300_009
    f.write_bytes(b'{"a": ')
    torn = partial_last_line(f)
    assert torn is not None and (torn.complete_bytes, torn.partial_bytes) == (0, 6)


def _copy_without_times(src_run: Path, dest: Path) -> Path:
    """A copy as ``cp`` without ``-p`` makes it: every file gets the copy's time, in any order."""
    dest.mkdir()
    for f in sorted(src_run.parent.iterdir(), reverse=True):  # the aggregate first: older than rollouts
        target = dest / f.name
        if f.is_dir():
            shutil.copytree(f, target, copy_function=shutil.copyfile)
        else:
            shutil.copyfile(f, target)
    agg = dest / "eval_aggregate_metrics.json"
    st = (dest / "eval.jsonl").stat()
    os.utime(agg, ns=(st.st_atime_ns, st.st_mtime_ns - 5_000_000_000))
    return dest / "eval.jsonl"


def test_copy_without_times_exports(
    quickstart_run: Path, local_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy_without_times(quickstart_run, tmp_path / "copied")
    assert main(["export", str(copy), "-c", str(local_config), "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "EXPORTED"


def test_touched_rollouts_alone_stay_exportable(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    os.utime(agg, ns=(0, 1_000_000_000))
    quickstart_run.touch()
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "EXPORTED"


def test_changed_rollouts_are_stale_by_content_and_the_named_override_works(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = quickstart_run.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[0])
    record["reward"] = 1.0 - float(record["reward"])  # one rollout re-scored after aggregation
    quickstart_run.write_bytes(json.dumps(record).encode() + b"\n" + b"".join(lines[1:]))
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    os.utime(agg, ns=(0, 1_000_000_000))
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 1
    [refused] = json.loads(capsys.readouterr().out)
    assert "aggregate metrics are stale" in refused["reason"]
    assert "mean rewards differ" in refused["reason"]
    assert STALE_OVERRIDE_FLAG in refused["reason"]
    args = ["export", str(quickstart_run), "-c", str(local_config), "--json", STALE_OVERRIDE_FLAG]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "EXPORTED"


def test_undecidable_content_falls_back_to_times(
    quickstart_run: Path, local_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(agg.read_text())
    for e in entries:
        e["agent_metrics"].pop("mean/reward")
    agg.write_text(json.dumps(entries))
    os.utime(agg, ns=(0, 1_000_000_000))
    assert main(["export", str(quickstart_run), "-c", str(local_config), "--json"]) == 1
    [refused] = json.loads(capsys.readouterr().out)
    assert "older than the rollouts and the content cannot tell" in refused["reason"]
    assert STALE_OVERRIDE_FLAG in refused["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("command", [["status"], ["report"], ["export"], ["status", "--json"]])
def test_missing_run_exits_2_and_writes_nothing(tmp_path: Path, command: list[str]) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    for name in ("nope.jsonl", "gone_folder"):
        proc = run_bounded(
            [sys.executable, "-m", "gym_artifacts", command[0], name, *command[1:]],
            capture_output=True, text=True, cwd=work, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert f"no run at {name}" in proc.stderr
        assert proc.stdout == ""
        assert list(work.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["with-gpu-samples", "no-gpu"])
def test_reactor_folder_exports_its_derived_config_as_params(reactor_fixture, tmp_path: Path, name: str) -> None:
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from gym_artifacts.report import build_report

    folder = reactor_fixture(name)
    derived = json.loads((folder / "derived_config.json").read_text())
    store = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": store},
                       "local": {"enabled": True, "root": str(tmp_path / "store")}}}
    )  # fmt: skip
    results = {r.exporter: r for r in export_run(folder, cfg)}
    assert {r.status.value for r in results.values()} == {"EXPORTED"}, results
    params = MlflowClient(store).get_run(results["mlflow"].backend_run_id).data.params
    assert params["model"] == derived["model"] == "reactor-artifacts-fixture"
    assert params["resolution.width"] == "64" and params["workload.layers"] == "3"
    [run_dir] = (tmp_path / "store" / "default").iterdir()
    assert json.loads((run_dir / "config.json").read_text()) == derived
    page = build_report(folder, tmp_path / "r.html").read_text()
    assert "no saved config" not in page and "reactor-artifacts-fixture" in page


def _mlflow_export(run: Path, tmp_path: Path) -> object:
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from gym_artifacts import export_run

    store = mlflow_sqlite(tmp_path / 'times.db')
    cfg = OmegaConf.create({"exporters": {"mlflow": {"enabled": True, "tracking_uri": store}}})
    [result] = export_run(run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    return MlflowClient(store).get_run(result.backend_run_id)


@pytest.mark.slow
def test_three_day_old_journal_gives_an_mlflow_run_three_days_ago(quickstart_run: Path, tmp_path: Path) -> None:
    import getpass
    import time

    (quickstart_run.with_name("eval_artifacts") / "session_times.json").unlink()
    journal = quickstart_run.with_name("eval_metrics.jsonl")
    first = time.time() - 3 * 86400
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    for i, line in enumerate(lines):
        line["time"] = first + 60 * i
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    run = _mlflow_export(quickstart_run, tmp_path)
    assert run.info.start_time == int(first * 1000)
    assert run.info.end_time == int((first + 60 * (len(lines) - 1)) * 1000)
    assert bookkeeping_of(run.data.tags)["times_from"] == "journal"
    assert run.data.tags["mlflow.source.name"] == str(quickstart_run.absolute())
    assert run.data.tags["mlflow.user"] == getpass.getuser()


@pytest.mark.slow
def test_session_times_win_over_the_journal(quickstart_run: Path, tmp_path: Path) -> None:
    import datetime as dt

    times = json.loads((quickstart_run.with_name("eval_artifacts") / "session_times.json").read_text())
    run = _mlflow_export(quickstart_run, tmp_path)
    assert run.info.start_time == int(dt.datetime.fromisoformat(times["start"]).timestamp() * 1000)
    assert run.info.end_time == int(dt.datetime.fromisoformat(times["end"]).timestamp() * 1000)
    assert bookkeeping_of(run.data.tags)["times_from"] == "session"


@pytest.mark.slow
def test_without_session_or_journal_the_rollouts_give_the_times_never_the_files(
    quickstart_run: Path, tmp_path: Path
) -> None:
    """A copy's file times say when it was copied: the run's times come from its rollouts'
    own times (the Responses' created_at here), whatever the files' times."""
    from gym_artifacts.run.trajectory import rollout_window

    (quickstart_run.with_name("eval_artifacts") / "session_times.json").unlink()
    quickstart_run.with_name("eval_metrics.jsonl").unlink()
    lines = quickstart_run.read_text().splitlines()
    stamped = [json.dumps({**json.loads(line), "timestamp": 1_700_000_000 + 10 * n}) for n, line in enumerate(lines)]
    quickstart_run.write_text("\n".join(stamped) + "\n")
    windows = [rollout_window(json.loads(line)) for line in stamped]
    for f in quickstart_run.parent.rglob("*"):
        if f.is_file():
            os.utime(f, (2_000_000_000, 2_000_000_000))
    run = _mlflow_export(quickstart_run, tmp_path)
    start = min(w[0] for w in windows if w[0] is not None)
    end = max(w[1] for w in windows if w[1] is not None)
    assert (run.info.start_time, run.info.end_time) == (int(start * 1000), int(end * 1000))
    assert bookkeeping_of(run.data.tags)["times_from"] == "rollouts"
