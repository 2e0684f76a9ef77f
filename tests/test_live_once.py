"""One run after live logging, and one live writer per output (local, MLflow on SQLite, W&B offline).

A live run that ``complete()``d and lost nothing is certified by a plain ``export``: no second
run in any backend, each metric's history once, and the next export SKIPPED. A live run that
lost calls is repaired by the export, never replaced: it gets what it lacks from the run's files
(``status`` says so before). A second live process on one output is refused loudly; a dead one blocks nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.cli import main
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live.fanout import NoOpLiveRun, live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker
from tests.conftest import QUICKSTART
from tests.load import scaled
from tests.mlflow_store import mlflow_sqlite
from tests.processes import reaped
from tests.wandb_records import offline_runs

REPO = Path(__file__).resolve().parent.parent
STEPS = 10


def write_eval_output(out: Path) -> None:
    """What the eval itself writes beside the live journal: rollouts, config, aggregates."""
    shutil.copy(QUICKSTART / "eval.jsonl", out)
    shutil.copy(QUICKSTART / "eval_config.yaml", out.with_name(f"{out.stem}_config.yaml"))
    shutil.copy(QUICKSTART / "eval_aggregate_metrics.json", out.with_name(f"{out.stem}_aggregate_metrics.json"))


def three_backends(tmp_path: Path) -> dict[str, Any]:
    return {"exporters": {
        "local": {"enabled": True, "root": str(tmp_path / "store")},
        "mlflow": {"enabled": True, "tracking_uri": mlflow_sqlite(tmp_path / 'm.db'), "experiment_name": "live"},
        "wandb": {"enabled": True, "project": "live", "mode": "offline", "dir": str(tmp_path / "wb")},
    }}  # fmt: skip


def live_eval(cfg: dict[str, Any], out: Path, **kwargs: Any) -> list[Any]:
    with live_run(cfg, out, teardown_timeout=kwargs.pop("teardown_timeout", 120)) as live:
        for step in range(STEPS):
            live.export_metrics({"reward": step / 10}, step=step)
        write_eval_output(out)
        live.complete()
        for step in range(STEPS, STEPS + kwargs.pop("extra_steps", 0)):
            live.export_metrics({"reward": step / 10}, step=step)
    return list(live.reports)


def mlflow_runs(tmp_path: Path) -> list[Any]:
    client = MlflowClient(mlflow_sqlite(tmp_path / 'm.db'))
    return list(client.search_runs([client.get_experiment_by_name("live").experiment_id]))


@pytest.mark.slow
def test_a_completed_lossless_live_run_is_the_one_run_in_every_backend(tmp_path: Path) -> None:
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    cfg = three_backends(tmp_path)
    reports = live_eval(cfg, out)
    assert all(r.lost == 0 and r.teardown_finished for r in reports), [r.describe() for r in reports]
    live_ids = {r.exporter: r.run_id for r in reports}
    for name in ("local", "mlflow", "wandb"):
        marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath(name))
        assert marker is not None and marker.state == "completed" and marker.lossless is True

    results = {r.exporter: r for r in export_run(out, cfg)}  # a plain export: no --certify
    for name, result in results.items():
        assert result.status is ExportStatus.EXPORTED, result.reason
        assert result.backend_run_id == live_ids[name], name  # certified, no new run
    [folder] = (tmp_path / "store" / "default").iterdir()
    run_json = json.loads((folder / "run.json").read_text())
    assert run_json["certified"] is True
    assert [json.loads(x)["step"] for x in (folder / "metrics.jsonl").read_text().splitlines()] == list(range(STEPS))
    [ml_run] = mlflow_runs(tmp_path)
    history = MlflowClient(mlflow_sqlite(tmp_path / 'm.db')).get_metric_history(ml_run.info.run_id, "reward")
    assert sorted(m.step for m in history) == list(range(STEPS))
    wandb_runs = offline_runs(tmp_path / "wb")
    assert {r.run_id for r in wandb_runs} == {live_ids["wandb"]}
    assert sorted(s for r in wandb_runs for s in r.steps) == list(range(STEPS))

    again = export_run(out, cfg)
    assert [r.status for r in again] == [ExportStatus.SKIPPED] * 3


@pytest.mark.slow
def test_a_live_run_that_lost_calls_is_repaired_by_the_export_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    cfg = {"exporters": {"local": three_backends(tmp_path)["exporters"]["local"]}}
    # The backend's worker cannot keep up with a zero teardown deadline: calls are left behind.
    reports = live_eval(cfg, out, teardown_timeout=0, extra_steps=20_000)
    [report] = reports
    assert report.lost > 0
    marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath("local"))
    assert marker is not None and marker.lossless is False and marker.lost_calls == report.lost
    assert main(["status", str(out)]) == 0
    assert "the export completes it from the run's files" in capsys.readouterr().out
    live_folder = tmp_path / "store" / "default" / str(report.run_id)
    live_lines = len((live_folder / "metrics.jsonl").read_text().splitlines())

    [result] = export_run(out, cfg)
    assert result.status is ExportStatus.EXPORTED and result.backend_run_id == report.run_id, result
    assert [p.name for p in (tmp_path / "store" / "default").iterdir()] == [report.run_id]
    folder = tmp_path / "store" / "default" / report.run_id
    live_json = json.loads((folder / "run.json").read_text())
    assert live_json["status"] == "FINISHED" and "superseded_by" not in live_json
    journal = out.with_name("eval_metrics.jsonl").read_text().splitlines()
    sent = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in sent] == [json.loads(x) for x in journal]
    assert len(sent) > live_lines  # the points the live run lost are in it now


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gym_artifacts.live import live_run
    out, who, go, root = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    cfg = {"exporters": {"local": {"enabled": True, "root": root}}}
    with live_run(cfg, out, teardown_timeout=60) as live:
        print("refused" if getattr(live, "writer_refused", None) else "writing", flush=True)
        for step in range(5):
            live.export_metrics({"writer": who, "x": step}, step=step)
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        live.complete()
    """
)


def writer(out: Path, who: str, go: Path, root: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(out), who, str(go), str(root)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


@pytest.mark.slow
def test_a_second_live_process_on_one_output_is_refused_and_nothing_mixes(tmp_path: Path) -> None:
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    go, root = tmp_path / "go", tmp_path / "store"
    first = writer(out, "first", go, root)
    procs = [first]
    with reaped(procs):
        assert first.stdout is not None and first.stdout.readline().strip() == "writing"
        second = writer(out, "second", go, root)
        procs.append(second)
        out2, err2 = second.communicate(timeout=120)
        assert second.returncode == 0 and out2.strip() == "refused"
        assert "live logging refused" in err2 and f"pid {first.pid}" in err2
        go.touch()
        _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1
    journal = [json.loads(x) for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert {line["metrics"]["writer"] for line in journal} == {"first"} and len(journal) == 5
    [folder] = (root / "default").iterdir()
    assert read_marker(RunArtifacts.from_path(out).run_id_marker_fpath("local")).run_id == folder.name
    write_eval_output(out)
    [result] = export_run(out, {"exporters": {"local": {"enabled": True, "root": str(root)}}})
    assert result.status is ExportStatus.EXPORTED
    lines = [json.loads(x) for x in (root / "default" / result.backend_run_id / "metrics.jsonl").read_text().splitlines()]
    assert {x["metrics"]["writer"] for x in lines} == {"first"}


def test_a_dead_live_writer_blocks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    go = tmp_path / "never"
    dead = writer(out, "dead", go, tmp_path / "store")
    assert dead.stdout is not None and dead.stdout.readline().strip() == "writing"
    os.kill(dead.pid, signal.SIGKILL)
    dead.communicate(timeout=30)
    started = time.monotonic()
    with live_run({"exporters": {}}, out) as live:
        assert not isinstance(live, NoOpLiveRun)
        with live_run({"exporters": {}}, out) as same_output:  # a second writer, even here
            assert isinstance(same_output, NoOpLiveRun) and same_output.writer_refused
    assert time.monotonic() - started < scaled(30)
