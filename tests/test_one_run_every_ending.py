"""One backend run per destination, for every way NeMo Gym 0.7.0 ends a collection (issue 38).

NeMo Gym's own call sequence (``nemo_gym/rollout_collection.py`` of 0.7.0), reproduced in process
through the drop-in ``gym_artifacts.nemo_gym`` with the real output of a real collection
(``tests/fixtures/nemo-gym-0.7.0``):

1. ``setup_exporters(global_config)``, after the planned inputs were written
   (``OUT_materialized_inputs.jsonl``);
2. while rollouts complete (in completion order): each is written to ``OUT.jsonl``, or, failed
   with ``+route_failures_to_sidecar=true``, to ``OUT_failures.jsonl``; at each whole percent
   printed, ``export_metrics(progress/*, step=int(pct))``;
3. after the collection, ``export_rollouts(every result)``: the failed ones too (they are only
   in the sidecar);
4. ``export_metrics(aggregate metrics)`` without a step, then ``OUT_aggregate_metrics.json``;
5. ``export_metrics(coverage/*)`` without a step;
6. the exit hook tears the exporters down (here: ``teardown_exporters()``).

Then ``gym-artifacts export OUT.jsonl`` (and of a copy of the run in another folder): exactly one
MLflow run (FINISHED, its start and end the eval's, each metric's history points once, the
aggregates once), one W&B run id in one offline folder, one local folder, one TensorBoard folder.
Also with the MLflow server killed for part of the collection (the live run lost calls: repaired
by the export, not replaced), and outside NeMo Gym (``live_run``).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboard")

from gym_artifacts.cli import main
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
NG = REPO / "tests" / "fixtures" / "nemo-gym-0.7.0"
AGENT = "example_single_tool_call_simple_agent"


def lines(fpath: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in fpath.read_text().splitlines() if x.strip()]


def ng_config(tmp_path: Path, out: Path, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """A NeMo Gym global config: its flat keys for MLflow and W&B, this project's sections for the rest."""
    return {
        "output_jsonl_fpath": str(out),
        "results_dir": str(out.parent),
        "route_failures_to_sidecar": True,
        "mlflow_tracking_uri": tracking_uri,
        "mlflow_experiment_name": experiment,
        "mlflow_run_name": "ng-run",
        "wandb_project": "one",
        "wandb_name": "ng-run",
        "wandb_api_key": "k" * 40,
        "exporters": {
            "wandb": {"mode": "offline", "dir": str(tmp_path / "wb")},
            "local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": experiment},
            "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
        },
    }


def rollout_for_export(result: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym 0.7.0's ``_rollout_for_export``, as its source has it: what ``export_rollouts``
    gets with ``observability_enabled`` (the trajectory and raw model-call payloads left out)."""
    sanitized = dict(result)
    sanitized.pop("ng_trajectory", None)
    sanitized.pop("ng_model_call_capture", None)
    capture = result.get("ng_model_call_capture")
    if isinstance(capture, dict):
        sanitized_capture = dict(capture)
        calls = capture.get("calls")
        if isinstance(calls, list):
            payload_keys = ("request", "response", "request_raw", "response_raw")
            sanitized_capture["calls"] = [
                {k: v for k, v in call.items() if k not in payload_keys}
                for call in calls
                if isinstance(call, dict)
            ]
        else:
            sanitized_capture.pop("calls", None)
        sanitized["ng_model_call_capture"] = sanitized_capture
    return sanitized


def with_observability(result: dict[str, Any]) -> dict[str, Any]:
    """A result as ``observability_enabled: true`` writes it: its trajectory and captured calls."""
    call = {"request": {"messages": ["hi"]}, "response": {"text": "weather"}, "latency_ms": 12, "status": 200}
    return {
        **result,
        "ng_trajectory": {"steps": [{"role": "user"}]},
        "ng_model_call_capture": {"calls": [call]},
    }


def collect_like_nemo_gym(
    fixture: str, out: Path, config: dict[str, Any], *, during: Any = None, observability: bool = False
) -> tuple[float, float]:
    """NeMo Gym 0.7.0's call sequence (module docstring) on the fixture's rows; ``during(i)`` runs
    after the i-th completed rollout; ``observability``: the results carry their trajectory and
    captured model calls, which NeMo Gym leaves out of what it hands the exporters. Returns the
    eval's (start, end) as the wall clock saw them."""
    from gym_artifacts import nemo_gym as ng

    src = NG / fixture
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(
        src / "rollouts_materialized_inputs.jsonl", out.with_name(f"{out.stem}_materialized_inputs.jsonl")
    )
    start = time.time()
    ng.setup_exporters(config)
    successes, failures = lines(src / "rollouts.jsonl"), lines(src / "rollouts_failures.jsonl")
    completed = successes[:3] + failures[:1] + successes[3:6] + failures[1:] + successes[6:]
    if observability:
        completed = [with_observability(r) for r in completed]
    total = len(completed)
    pcts = [10 * i for i in range(1, 11)]
    with open(out, "ab") as results, open(out.with_name(f"{out.stem}_failures.jsonl"), "ab") as failed:
        for i, result in enumerate(completed, 1):
            target = failed if result.get("_ng_failure_class") else results
            target.write(json.dumps(result).encode() + b"\n")
            target.flush()
            pct = 100 * i / total
            if pcts and pct >= pcts[0]:
                while pcts and pct >= pcts[0]:
                    pcts.pop(0)
                ng.export_metrics(
                    {"progress/total/rollouts_per_min": 60.0 * i, f"progress/{AGENT}/reward": 50.0},
                    step=int(pct),
                )
            if during is not None:
                during(i)
    ng.export_rollouts([rollout_for_export(r) for r in completed])  # every result, the failed ones too
    aggregate = json.loads((src / "rollouts_aggregate_metrics.json").read_text())
    to_log: dict[str, Any] = {}
    for entry in aggregate:
        name = entry["agent_ref"]["name"]
        to_log.update(
            {f"{name}/{k}": v for k, v in entry["agent_metrics"].items() if isinstance(v, (int, float, str))}
        )
        to_log.update({f"key_metrics/{name}/{k}": v for k, v in entry["key_metrics"].items()})
    ng.export_metrics(to_log)
    out.with_name(f"{out.stem}_aggregate_metrics.json").write_text(json.dumps(aggregate, indent=2))
    planned = len(lines(src / "rollouts_materialized_inputs.jsonl"))
    ng.export_metrics({"coverage/expected": planned, "coverage/scored": len(successes),
                       "coverage/missing": planned - len(successes)})  # fmt: skip
    ng.teardown_exporters()
    return start, time.time()


def export(out: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    code = main(["export", str(out), "--json"])
    text = capsys.readouterr().out
    assert code == 0, text
    return json.loads(text)  # type: ignore[no-any-return]


def mlflow_runs(uri: str, experiment: str) -> list[Any]:
    """Every run of the experiment, deleted ones too (a spare run made and deleted is a defect)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return list(client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL)) if exp else []


def assert_tensorboard_points_once(folder: Path) -> None:
    """Read back with TensorBoard's own reader: each scalar at each step once."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert tags
    for tag in tags:
        steps = [e.step for e in acc.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, steps)


def tb_folders(tmp_path: Path) -> list[str]:
    logdir = tmp_path / "tb"
    return (
        sorted(p.name for p in logdir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if logdir.is_dir()
        else []
    )


def wandb_folders(tmp_path: Path) -> dict[str, list[str]]:
    """W&B offline folders by run id."""
    by_id: dict[str, list[str]] = {}
    for f in sorted((tmp_path / "wb").rglob("offline-run-*/run-*.wandb")):
        by_id.setdefault(f.stem.removeprefix("run-"), []).append(f.parent.name)
    return by_id


def journal_of(tmp_path: Path) -> Path:
    """The metrics journal of the run under ``tmp_path/results``."""
    [journal] = (tmp_path / "results").glob("*_metrics.jsonl")
    return journal


def assert_one_run_everywhere(
    tmp_path: Path, uri: str, experiment: str, eval_times: tuple[float, float], *, wandb: bool = True
) -> Any:
    """One run per destination, and the MLflow run as the eval made it: FINISHED, the eval's
    start and end, each metric point once, the aggregates once."""
    from mlflow.tracking import MlflowClient

    runs = mlflow_runs(uri, experiment)
    assert len(runs) == 1, [(r.info.run_id, r.info.status, r.data.tags.get("gym_artifacts")) for r in runs]
    local = sorted(p.name for p in (tmp_path / "store" / experiment).iterdir())
    assert len(local) == 1, local
    assert len(tb_folders(tmp_path)) == 1, tb_folders(tmp_path)
    assert_tensorboard_points_once(tmp_path / "tb" / tb_folders(tmp_path)[0])
    if wandb:
        from tests.wandb_records import offline_runs

        folders = wandb_folders(tmp_path)
        assert len(folders) == 1 and all(len(v) == 1 for v in folders.values()), folders
        [offline] = offline_runs(tmp_path / "wb")
        journal = sorted({e["step"] for e in lines(journal_of(tmp_path))})
        assert sorted(offline.steps) == journal, (offline.steps, journal)  # each step once
    [run] = runs
    assert run.info.status == "FINISHED" and run.info.lifecycle_stage == "active"
    start, end = eval_times
    assert start - 1 <= run.info.start_time / 1000 <= end + 1
    assert start - 1 <= run.info.end_time / 1000 <= end + 1, (run.info.end_time / 1000, end)
    client = MlflowClient(uri)
    for key in run.data.metrics:
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert len(history) == len(set(history)), (key, history)
        if key.startswith(("coverage/", f"{AGENT}/", "key_metrics/")):
            assert len(history) == 1, (key, history)
    return run


def test_failures_routed_to_the_sidecar_then_export_is_one_run_everywhere(
    tmp_path: Path, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = f"fail-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "results" / "rollouts.jsonl"
    times = collect_like_nemo_gym("with-failures", out, ng_config(tmp_path, out, tracking_uri, experiment))
    assert len(lines(out)) == 8 and len(lines(out.with_name("rollouts_failures.jsonl"))) == 2
    time.sleep(1.5)  # the export runs after the eval: its time is not the eval's
    results = export(out, capsys)
    assert Counter(r["status"] for r in results) == Counter({"EXPORTED": 4}), results
    assert_one_run_everywhere(tmp_path, tracking_uri, experiment, times)
    assert {r["status"] for r in export(out, capsys)} == {"SKIPPED"}


def test_a_collection_with_observability_then_export_is_one_run_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``observability_enabled: true``: the files hold each result's trajectory and captured model
    calls, the live run got NeMo Gym's exporter view of them; still the live run's."""
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    out = tmp_path / "results" / "rollouts.jsonl"
    times = collect_like_nemo_gym(
        "with-failures", out, ng_config(tmp_path, out, uri, "obs"), observability=True
    )
    assert "ng_trajectory" in lines(out)[0]
    export(out, capsys)
    assert_one_run_everywhere(tmp_path, uri, "obs", times)


def test_a_clean_collection_then_export_logs_the_aggregates_once_at_the_evals_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    experiment = "clean"
    out = tmp_path / "results" / "rollouts.jsonl"
    times = collect_like_nemo_gym("clean", out, ng_config(tmp_path, out, uri, experiment))
    time.sleep(1.5)
    export(out, capsys)
    assert_one_run_everywhere(tmp_path, uri, experiment, times)


def test_an_export_of_a_copy_of_the_run_in_another_folder_adds_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    experiment = "copy"
    out = tmp_path / "results" / "rollouts.jsonl"
    times = collect_like_nemo_gym("with-failures", out, ng_config(tmp_path, out, uri, experiment))
    copy = tmp_path / "elsewhere" / "copied-run"
    shutil.copytree(out.parent, copy)  # markers and config included, before any export
    export(out, capsys)
    export(copy / "rollouts.jsonl", capsys)
    assert_one_run_everywhere(tmp_path, uri, experiment, times)
    # and a copy made of the bare files after the export (no marker, no receipt)
    bare = tmp_path / "bare" / "copied-run"
    bare.mkdir(parents=True)
    for name in ("rollouts.jsonl", "rollouts_failures.jsonl", "rollouts_materialized_inputs.jsonl",
                 "rollouts_aggregate_metrics.json", "rollouts_metrics.jsonl", "rollouts_config.yaml"):  # fmt: skip
        shutil.copy2(out.with_name(name), bare / name)
    export(bare / "rollouts.jsonl", capsys)
    assert_one_run_everywhere(tmp_path, uri, experiment, times)


def test_a_live_run_that_lost_calls_while_the_server_was_down_is_repaired_not_replaced(
    tmp_path: Path, own_mlflow_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = own_mlflow_server.start()
    experiment = "down"
    out = tmp_path / "results" / "rollouts.jsonl"

    def kill_then_restart(i: int) -> None:
        if i == 2:
            server.stop()
        elif i == 9:
            server.start()

    config = ng_config(tmp_path, out, server.uri, experiment)
    times = collect_like_nemo_gym("with-failures", out, config, during=kill_then_restart)
    live = mlflow_runs(server.uri, experiment)
    assert len(live) == 1
    time.sleep(1.0)
    export(out, capsys)
    run = assert_one_run_everywhere(tmp_path, server.uri, experiment, times)
    assert run.info.run_id == live[0].info.run_id  # repaired, not replaced
    from mlflow.tracking import MlflowClient

    steps = {
        m.step
        for m in MlflowClient(server.uri).get_metric_history(
            run.info.run_id, "progress/total/rollouts_per_min"
        )
    }
    journal = {
        e["step"]
        for e in lines(out.with_name("rollouts_metrics.jsonl"))
        if "progress/total/rollouts_per_min" in e["metrics"]
    }
    assert steps == journal and len(steps) == 10


def small_live_eval(tmp_path: Path, exporters: dict[str, Any], *, unlogged_rows: int = 0) -> Path:
    """A small eval live-logged through ``live_run`` (5 steps, 4 rollouts), its aggregate
    written after the ``with`` block; ``unlogged_rows`` more rollouts are written to ``OUT.jsonl``
    that the live run never logged. Returns ``OUT.jsonl``."""
    from gym_artifacts.live import live_run

    out = tmp_path / "results" / "eval.jsonl"
    out.parent.mkdir(parents=True)
    rows = [{"agent_ref": {"name": "a"}, "_ng_task_index": i, "reward": float(i % 2)} for i in range(4)]
    written = rows + [
        {"agent_ref": {"name": "a"}, "_ng_task_index": 9 + i, "reward": 1.0} for i in range(unlogged_rows)
    ]
    with live_run({"exporters": exporters}, out) as live:
        for step in range(5):
            live.export_metrics({"reward": step / 5}, step=step)
        live.export_rollouts(rows)
        out.write_text("".join(json.dumps(r) + "\n" for r in written))
    mean = sum(r["reward"] for r in written) / len(written)
    out.with_name("eval_aggregate_metrics.json").write_text(
        json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": mean}}])
    )
    return out


def test_live_logging_then_export_leaves_one_tensorboard_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = small_live_eval(tmp_path, {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}})
    [live_folder] = tb_folders(tmp_path)
    export(out, capsys)
    assert tb_folders(tmp_path) == [live_folder]
    copy = tmp_path / "other-name" / "eval.jsonl"
    shutil.copytree(out.parent, copy.parent)
    export(copy, capsys)
    assert tb_folders(tmp_path) == [live_folder]
    assert_tensorboard_points_once(tmp_path / "tb" / live_folder)


def test_resume_after_a_crash_with_nothing_lost_continues_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42 item 8: the first process dies without a teardown (no delivery record); a resumed
    process finishes the eval; the export (plain, then with ``--certify``) continues that run."""
    import sys
    import textwrap

    out = tmp_path / "results" / "eval.jsonl"
    store = tmp_path / "store"
    crash = textwrap.dedent(
        """
        import json, os, sys
        from gym_artifacts.live import live_run
        cfg = {"exporters": {"local": {"enabled": True, "root": sys.argv[2], "experiment": "r"}}, "resume": True}
        with live_run(cfg, sys.argv[1]) as live:
            for step in range(5):
                live.export_metrics({"reward": step / 5}, step=step)
            assert live.flush(30)
            os._exit(9)
        """
    )
    run_bounded([sys.executable, "-c", crash, str(out), str(store)], timeout=120, cwd=tmp_path)
    [live_id] = [p.name for p in (store / "r").iterdir()]
    from gym_artifacts.live import live_run

    cfg = {"exporters": {"local": {"enabled": True, "root": str(store), "experiment": "r"}}, "resume": True}
    rows = [{"agent_ref": {"name": "a"}, "reward": float(i % 2)} for i in range(4)]
    with live_run(cfg, out) as live:
        for step in range(5, 10):
            live.export_metrics({"reward": step / 10}, step=step)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out.with_name("eval_aggregate_metrics.json").write_text(
            json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.5}}])
        )
        live.complete()
    for flags in ([], ["--complete-live-run"]):
        capsys.readouterr()
        assert main(["export", str(out), "--json", *flags]) == 0
        [result] = json.loads(capsys.readouterr().out)
        assert result["backend_run_id"] == live_id, result
        assert [p.name for p in (store / "r").iterdir()] == [live_id]


def test_a_live_run_that_cannot_be_completed_is_ended_and_names_the_complete_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files that differ from what the live run logged make a new run; a live run whose teardown
    never reached the backend (left RUNNING) is then ended, never left running beside it."""
    from mlflow.tracking import MlflowClient

    from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of

    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    out = small_live_eval(tmp_path, {
        "mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "e"},
        "local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": "e"},
    }, unlogged_rows=1)  # fmt: skip
    [live_ml] = mlflow_runs(uri, "e")
    client = MlflowClient(uri)
    client.update_run(live_ml.info.run_id, status="RUNNING")  # its teardown never arrived
    [live_local] = list((tmp_path / "store" / "e").iterdir())
    run_json = json.loads((live_local / "run.json").read_text())
    (live_local / "run.json").write_text(json.dumps({**run_json, "status": "RUNNING"}))
    results = {r["exporter"]: r for r in export(out, capsys)}
    assert {r["status"] for r in results.values()} == {"EXPORTED"}
    ended = client.get_run(live_ml.info.run_id)
    assert ended.info.status == "KILLED"
    assert bookkeeping_of(ended.data.tags)["superseded_by"] == results["mlflow"]["backend_run_id"]
    assert client.get_run(results["mlflow"]["backend_run_id"]).info.status == "FINISHED"
    local_json = json.loads((live_local / "run.json").read_text())
    assert (
        local_json["status"] == "KILLED" and local_json["superseded_by"] == results["local"]["backend_run_id"]
    )


KILL_POINTS = [
    # the whole run written beside the live folder, nothing swapped yet
    ("gym_artifacts._builtin_exporters.tensorboard:TensorboardExporter._write_partial", 1, "after"),
    # the whole run's event file in the live folder beside the live ones, these not yet removed
    ("gym_artifacts._builtin_exporters.tensorboard:TensorboardExporter._remove_entries", 1, "before"),
    # W&B offline: the whole run's folder written beside the live one, that not yet removed
    ("gym_artifacts._builtin_exporters.wandb:_remove_earlier_offline_folders", 1, "before"),
]


@pytest.mark.parametrize(
    ("target", "nth", "when"), KILL_POINTS, ids=[t.split(":")[1] for t, _, _ in KILL_POINTS]
)
def test_an_export_killed_while_it_completes_a_live_run_then_rerun_leaves_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, nth: int, when: str
) -> None:
    from tests.reliability.test_crash import killed

    out = small_live_eval(tmp_path, {
        "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
        "wandb": {"enabled": True, "mode": "offline", "project": "k", "dir": str(tmp_path / "wb")},
    })  # fmt: skip
    [live_tb] = tb_folders(tmp_path)
    [live_wb] = wandb_folders(tmp_path)
    killed(target, nth, when, ["cli", "export", str(out)])
    results = export(out, capsys)
    assert {r["status"] for r in results} <= {"EXPORTED", "SKIPPED"}, results  # SKIPPED: done before the kill
    assert tb_folders(tmp_path) == [live_tb]
    assert_tensorboard_points_once(tmp_path / "tb" / live_tb)
    assert {k: len(v) for k, v in wandb_folders(tmp_path).items()} == {live_wb: 1}
    from tests.wandb_records import offline_runs

    [offline] = offline_runs(tmp_path / "wb")
    assert sorted(offline.steps) == list(range(5))


def test_copies_of_a_run_in_differently_named_folders_give_one_tensorboard_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside live logging too: the second copy finds the first's folder by the run's identity."""
    first = tmp_path / "sweep-a" / "rollouts.jsonl"
    first.parent.mkdir()
    src = NG / "clean"
    for name in ("rollouts.jsonl", "rollouts_aggregate_metrics.json", "rollouts_materialized_inputs.jsonl"):
        shutil.copy2(src / name, first.with_name(name))
    second = tmp_path / "other-name" / "rollouts.jsonl"
    shutil.copytree(first.parent, second.parent)
    for out in (first, second):
        capsys.readouterr()
        assert (
            main(["export", str(out), "-e", "tensorboard", f"exporters.tensorboard.logdir={tmp_path / 'tb'}"])
            == 0
        )
    assert len(tb_folders(tmp_path)) == 1, tb_folders(tmp_path)
