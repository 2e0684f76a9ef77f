"""Hostile and unlucky users against "one run per destination" (issue 38): the files that find a
run's copies (TensorBoard's ``.gym-artifacts-run.json``, W&B offline's index), a backend folder
deleted after an export, a failures sidecar that changes after the live run, two copies of a run
exported at once, and what the copy-finding scan reads when the destination holds many runs.

Every export runs in a subprocess with a deadline: a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorboard")

from tests.mlflow_store import mlflow_sqlite
from tests.processes import reaped, run_bounded
from tests.test_one_run_every_ending import NG, assert_tensorboard_points_once, small_live_eval, tb_folders

pytestmark = pytest.mark.slow
EXPORT_DEADLINE = 120  # seconds; an export of these small runs takes a few
HANG_DEADLINE = 60  # where the attack is a hang: a few seconds are the export, the rest load


def plain_run(folder: Path, fixture: str = "clean") -> Path:
    """A finished NeMo Gym run (no live logging) in ``folder``: its ``rollouts.jsonl``."""
    folder.mkdir(parents=True)
    for name in ("rollouts.jsonl", "rollouts_aggregate_metrics.json", "rollouts_materialized_inputs.jsonl"):
        shutil.copy2(NG / fixture / name, folder / name)
    return folder / "rollouts.jsonl"


def cli_export(
    out: Path, *args: str, cwd: Path, deadline: float = EXPORT_DEADLINE
) -> subprocess.CompletedProcess[str]:
    """``gym-artifacts export OUT --json ARGS`` in a fresh process, bounded in time."""
    return run_bounded(
        [sys.executable, "-m", "gym_artifacts.cli", "export", str(out), "--json", *args],
        capture_output=True, text=True, timeout=deadline, cwd=cwd,
    )  # fmt: skip


def results_of(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def tensorboard_to(tmp_path: Path) -> list[str]:
    return ["-e", "tensorboard", f"exporters.tensorboard.logdir={tmp_path / 'tb'}"]


def wandb_offline_to(tmp_path: Path) -> list[str]:
    return ["-e", "wandb", "exporters.wandb.mode=offline", "exporters.wandb.project=p",
            f"exporters.wandb.dir={tmp_path / 'wb'}"]  # fmt: skip


def test_a_fifo_named_as_a_tensorboard_identity_file_does_not_hang_the_export(tmp_path: Path) -> None:
    """Any entry of the log folder may be anything: a FIFO where a run folder's identity file
    would be is not a run of this identity (read without blocking), and the export goes on."""
    out = plain_run(tmp_path / "run")
    planted = tmp_path / "tb" / "someone-elses"
    planted.mkdir(parents=True)
    os.mkfifo(planted / ".gym-artifacts-run.json")
    done = cli_export(out, *tensorboard_to(tmp_path), cwd=tmp_path, deadline=HANG_DEADLINE)
    assert done.returncode == 0, done.stderr[-2000:]
    [result] = results_of(done)
    assert result["status"] == "EXPORTED"
    assert result["backend_run_id"] in tb_folders(tmp_path)


def test_a_fifo_in_the_wandb_offline_index_does_not_hang_the_export(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    out = plain_run(tmp_path / "run")
    first = cli_export(out, *wandb_offline_to(tmp_path), cwd=tmp_path)
    [result] = results_of(first)
    assert result["status"] == "EXPORTED", result
    wandb_dir = tmp_path / "wb" / "wandb"
    [entry] = (wandb_dir / ".gym-artifacts-runs").iterdir()
    entry.unlink()
    os.mkfifo(entry)
    for receipt in out.parent.glob("*_export_done.json"):  # as if the run were exported anew from a copy
        receipt.unlink()
    done = cli_export(out, *wandb_offline_to(tmp_path), cwd=tmp_path, deadline=HANG_DEADLINE)
    assert done.returncode == 0, done.stderr[-2000:]
    [again] = results_of(done)
    assert again["status"] in ("EXPORTED", "SKIPPED"), again


def test_verify_recreates_a_tensorboard_folder_deleted_after_the_export(tmp_path: Path) -> None:
    """``--verify`` asks each backend whether the receipted run is still there: a TensorBoard
    run folder is a folder on this machine, so a deleted one is known gone and exported anew,
    not trusted into nothing."""
    out = plain_run(tmp_path / "run")
    [first] = results_of(cli_export(out, *tensorboard_to(tmp_path), cwd=tmp_path))
    shutil.rmtree(tmp_path / "tb" / first["backend_run_id"])
    done = cli_export(out, "--verify", *tensorboard_to(tmp_path), cwd=tmp_path)
    [again] = results_of(done)
    assert again["status"] == "EXPORTED", again
    assert tb_folders(tmp_path) == [again["backend_run_id"]]
    assert_tensorboard_points_once(tmp_path / "tb" / again["backend_run_id"])
    # and a folder that is there is reported present: nothing written again
    [kept] = results_of(cli_export(out, "--verify", *tensorboard_to(tmp_path), cwd=tmp_path))
    assert kept["status"] == "SKIPPED" and "exists" in kept["reason"], kept


def test_verify_recreates_a_deleted_certified_live_tensorboard_folder(tmp_path: Path) -> None:
    """The live run completed in place, its folder then deleted: ``--verify`` writes the whole run
    again (one folder, each point once), instead of a receipt that points at nothing."""
    out = small_live_eval(tmp_path, {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}})
    [live] = tb_folders(tmp_path)
    [first] = results_of(cli_export(out, *tensorboard_to(tmp_path), cwd=tmp_path))
    assert first["backend_run_id"] == live, first
    shutil.rmtree(tmp_path / "tb" / live)
    [again] = results_of(cli_export(out, "--verify", *tensorboard_to(tmp_path), cwd=tmp_path))
    assert again["status"] == "EXPORTED", again
    [folder] = tb_folders(tmp_path)
    assert_tensorboard_points_once(tmp_path / "tb" / folder)


def live_eval_then_sidecar(tmp_path: Path, *, routed: bool) -> tuple[Path, str]:
    """A live-logged eval (local backend) whose failures sidecar gains a row after the live run
    ended; ``routed``: a failure was in the sidecar (and handed to the live run) already."""
    from gym_artifacts.live import live_run

    out = tmp_path / "results" / "eval.jsonl"
    out.parent.mkdir(parents=True)
    sidecar = out.with_name("eval_failures.jsonl")
    rows = [{"agent_ref": {"name": "a"}, "_ng_task_index": i, "reward": float(i % 2)} for i in range(4)]
    failed = {"agent_ref": {"name": "a"}, "_ng_task_index": 7, "_ng_failure_class": "HTTPError"}
    cfg = {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": "e"}}}
    with live_run(cfg, out) as live:
        for step in range(3):
            live.export_metrics({"reward": step / 3}, step=step)
        live.export_rollouts(rows + ([failed] if routed else []))
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        if routed:
            sidecar.write_text(json.dumps(failed) + "\n")
    out.with_name("eval_aggregate_metrics.json").write_text(
        json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.5}}])
    )
    [live_id] = [p.name for p in (tmp_path / "store" / "e").iterdir()]
    late = {"agent_ref": {"name": "a"}, "_ng_task_index": 8, "_ng_failure_class": "Timeout"}
    with open(sidecar, "a") as fh:  # the sidecar changes after the live run ended
        fh.write(json.dumps(late) + "\n")
    return out, live_id


@pytest.mark.parametrize("routed", [True, False], ids=["had-failures", "no-failures-then"])
def test_a_failures_sidecar_changed_after_the_live_run_makes_a_new_run(tmp_path: Path, routed: bool) -> None:
    """The live run never saw the failure added since: completing it with the changed files
    would be a false repair (the live run's record says it is this run); a new run is made and
    the live one notes it."""
    out, live_id = live_eval_then_sidecar(tmp_path, routed=routed)
    [result] = results_of(cli_export(out, "-e", "local", cwd=tmp_path))
    assert result["status"] == "EXPORTED", result
    assert result["backend_run_id"] != live_id, result
    live_json = json.loads((tmp_path / "store" / "e" / live_id / "run.json").read_text())
    assert live_json.get("superseded_by") == result["backend_run_id"], live_json


def test_two_copies_of_a_run_exported_at_once_give_one_folder_per_destination(tmp_path: Path) -> None:
    """Two exports of two copies of one run, started together (the identity lock orders them):
    one TensorBoard folder and one local folder."""
    first = plain_run(tmp_path / "sweep-a")
    second = tmp_path / "copy-b" / "rollouts.jsonl"
    shutil.copytree(first.parent, second.parent)
    args = [*tensorboard_to(tmp_path), "-e", "local", f"exporters.local.root={tmp_path / 'store'}"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gym_artifacts.cli", "export", str(out), "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for out in (first, second)
    ]
    with reaped(procs):
        outputs = [p.communicate(timeout=EXPORT_DEADLINE) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, stderr[-2000:]
        assert {r["status"] for r in json.loads(stdout)} == {"EXPORTED"}
    assert len(tb_folders(tmp_path)) == 1, tb_folders(tmp_path)
    assert len(list((tmp_path / "store" / "default").iterdir())) == 1


def test_a_changed_run_exported_on_purpose_after_its_live_run_was_completed_leaves_that_run_as_it_was(
    tmp_path: Path,
) -> None:
    """The export completed the live run; the run's aggregate then changed (NeMo Gym's aggregation
    rerun); the user deletes the receipts, as the refusal says, to export the changed run on
    purpose: it goes to a new backend run and the completed one is left as it was (MLflow: its
    aggregate once, not a second point; TensorBoard: its event files untouched)."""
    from mlflow.tracking import MlflowClient

    from tests.test_one_run_every_ending import mlflow_runs

    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    out = small_live_eval(tmp_path, {
        "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
        "local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": "e"},
        "mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "e"},
    })  # fmt: skip
    first = {r["exporter"]: r for r in results_of(cli_export(out, cwd=tmp_path))}
    assert {r["certified"] for r in first.values()} == {True}, first
    [live_tb] = tb_folders(tmp_path)
    tb_bytes = {p.name: p.read_bytes() for p in (tmp_path / "tb" / live_tb).iterdir() if p.is_file()}
    out.with_name("eval_aggregate_metrics.json").write_text(
        json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.99}}])
    )
    refused = results_of(cli_export(out, cwd=tmp_path))
    assert {r["status"] for r in refused} == {"FAILED"}, refused
    for receipt in out.parent.glob("*_export_done.json"):
        receipt.unlink()
    second = {r["exporter"]: r for r in results_of(cli_export(out, cwd=tmp_path))}
    assert {r["status"] for r in second.values()} == {"EXPORTED"}, second
    for name in ("local", "mlflow", "tensorboard"):
        assert second[name]["backend_run_id"] != first[name]["backend_run_id"], (name, second[name])
    client = MlflowClient(uri)
    old = first["mlflow"]["backend_run_id"]
    assert [m.value for m in client.get_metric_history(old, "a/mean/reward")] == [0.5]
    new = second["mlflow"]["backend_run_id"]
    assert [m.value for m in client.get_metric_history(new, "a/mean/reward")] == [0.99]
    assert len(mlflow_runs(uri, "e")) == 2
    assert sorted(tb_folders(tmp_path)) == sorted([live_tb, second["tensorboard"]["backend_run_id"]])
    assert {p.name: p.read_bytes() for p in (tmp_path / "tb" / live_tb).iterdir() if p.is_file()} == tb_bytes
    assert len(list((tmp_path / "store" / "e").iterdir())) == 2
