"""One backend run per destination after a live eval and ``gym-artifacts export``.

Three ways an eval ends, each followed by the CLI export, must leave exactly one run in each
destination (a real ``mlflow server``, W&B offline files, the local folder): NeMo Gym's own call
sequence through ``gym_artifacts.nemo_gym`` (no ``complete()``; the aggregate written after
teardown), the README's live example as written (``examples/live_eval.py``), and a
``live_run`` run whose aggregate is written after the ``with`` block. The export decides
from content that the files are the live run's. A run whose files truly differ from what the
live run logged is still exported anew, the live run marked superseded.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from tests.processes import run_bounded

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

NEMO_GYM_SEQUENCE = """
import json, sys
from pathlib import Path
from gym_artifacts.nemo_gym import setup_exporters, export_metrics, export_rollouts, teardown_exporters

config = json.loads(sys.argv[1])
explicit_teardown = config.pop("_explicit_teardown")
out = Path(config["output_jsonl_fpath"])
out.parent.mkdir(parents=True, exist_ok=True)
setup_exporters(config)
rows = []
with open(out, "w") as fh:
    for step in range(4):
        batch = [{"agent_ref": {"name": "ng_agent"}, "_ng_task_index": step * 2 + i,
                  "_ng_rollout_index": 0, "reward": float(i)} for i in range(2)]
        export_metrics({"progress/done": step + 1, "reward": 0.5}, step=step)
        export_rollouts(batch)
        fh.writelines(json.dumps(r) + "\\n" for r in batch)
        rows.extend(batch)
if explicit_teardown:
    teardown_exporters()  # else: at interpreter exit, as NeMo Gym's own exit hook does
mean = sum(r["reward"] for r in rows) / len(rows)  # NeMo Gym writes the aggregate at the end
agg = [{"agent_ref": {"name": "ng_agent"}, "agent_metrics": {"mean/reward": mean}}]
out.with_name(out.stem + "_aggregate_metrics.json").write_text(json.dumps(agg))
"""

LATE_AGGREGATE = """
import json, sys
from pathlib import Path
from gym_artifacts.live import live_run

config = json.loads(sys.argv[1])
out = Path(sys.argv[2])
out.parent.mkdir(parents=True, exist_ok=True)
rows = [{"agent_ref": {"name": "a"}, "_ng_task_index": i, "reward": float(i % 2)} for i in range(6)]
with live_run(config, out) as live:
    for step in range(3):
        live.export_metrics({"reward": step / 3}, step=step)
    live.export_rollouts(rows)
    out.write_text("".join(json.dumps(r) + "\\n" for r in rows))
agg = [{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.5}}]
out.with_name(out.stem + "_aggregate_metrics.json").write_text(json.dumps(agg))  # after teardown
"""


def destinations(tmp_path: Path, mlflow_uri: str, experiment: str, *, wandb: bool = True) -> dict[str, Any]:
    """``exporters`` sections for the three destinations of this test."""
    sections: dict[str, Any] = {
        "local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": experiment},
        "mlflow": {"enabled": True, "tracking_uri": mlflow_uri, "experiment_name": experiment},
    }
    if wandb:
        sections["wandb"] = {"enabled": True, "mode": "offline", "project": "one", "dir": str(tmp_path / "wb")}
    return sections


def run_python(args: list[str], cwd: Path) -> None:
    proc = run_bounded([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def export(out: Path, cwd: Path) -> list[dict[str, Any]]:
    proc = run_bounded(
        [sys.executable, "-m", "gym_artifacts", "export", str(out), "--json"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def backend_runs(tmp_path: Path, mlflow_uri: str, experiment: str, *, wandb: bool = True) -> dict[str, list[str]]:
    """Every run each destination holds for this eval, by id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = {
        "mlflow": [r.info.run_id for r in client.search_runs([exp.experiment_id])] if exp else [],
        "local": sorted(p.name for p in (tmp_path / "store" / experiment).iterdir()),
    }
    if wandb:
        from tests.wandb_records import offline_runs

        runs["wandb"] = sorted({r.run_id for r in offline_runs(tmp_path / "wb")})
    return runs


def assert_one_certified_run(tmp_path: Path, mlflow_uri: str, experiment: str) -> None:
    from mlflow.tracking import MlflowClient

    runs = backend_runs(tmp_path, mlflow_uri, experiment)
    assert {name: len(ids) for name, ids in runs.items()} == {"mlflow": 1, "local": 1, "wandb": 1}, runs
    [run_id] = runs["mlflow"]
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert bookkeeping_of(run.data.tags).get("certified") == "true"
    assert "superseded_by" not in bookkeeping_of(run.data.tags)
    local = json.loads((tmp_path / "store" / experiment / runs["local"][0] / "run.json").read_text())
    assert local["status"] == "FINISHED" and local.get("certified") is True


@pytest.mark.parametrize("explicit_teardown", [True, False], ids=["teardown", "exit-hook"])
def test_nemo_gym_call_sequence_then_export(tmp_path: Path, mlflow_server: Any, explicit_teardown: bool) -> None:
    experiment = f"ng-seq-{uuid.uuid4().hex[:8]}"
    config = {
        "output_jsonl_fpath": str(tmp_path / "results" / "rollouts.jsonl"),
        "results_dir": str(tmp_path / "results"),
        "mlflow_tracking_uri": mlflow_server.uri,
        "mlflow_experiment_name": experiment,
        "mlflow_run_name": "ng-run",
        "wandb_project": "one",
        "wandb_name": "ng-run",
        "wandb_api_key": "k" * 40,
        "exporters": {
            "local": {"enabled": True, "root": str(tmp_path / "store"), "experiment": experiment},
            "wandb": {"mode": "offline", "dir": str(tmp_path / "wb")},
        },
        "_explicit_teardown": explicit_teardown,
    }
    run_python(["-c", textwrap.dedent(NEMO_GYM_SEQUENCE), json.dumps(config)], tmp_path)
    results = export(tmp_path / "results" / "rollouts.jsonl", tmp_path)
    assert sorted(r["exporter"] for r in results) == ["local", "mlflow", "wandb"]
    assert_one_certified_run(tmp_path, mlflow_server.uri, experiment)


def test_the_readme_live_example_then_export(tmp_path: Path, mlflow_server: Any) -> None:
    experiment = f"readme-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"exporters": destinations(tmp_path, mlflow_server.uri, experiment)}))
    out = tmp_path / "results" / "eval.jsonl"
    run_python([str(REPO / "examples" / "live_eval.py"), str(cfg), str(out)], tmp_path)
    aggregate = json.loads(out.with_name("eval_aggregate_metrics.json").read_text())
    assert aggregate[0]["agent_ref"] == {"name": "toy_agent"}
    export(out, tmp_path)
    assert_one_certified_run(tmp_path, mlflow_server.uri, experiment)


def test_a_live_run_with_a_late_aggregate_then_export(tmp_path: Path, mlflow_server: Any) -> None:
    experiment = f"late-{uuid.uuid4().hex[:8]}"
    config = {"exporters": destinations(tmp_path, mlflow_server.uri, experiment)}
    out = tmp_path / "results" / "eval.jsonl"
    run_python(["-c", textwrap.dedent(LATE_AGGREGATE), json.dumps(config), str(out)], tmp_path)
    export(out, tmp_path)
    assert_one_certified_run(tmp_path, mlflow_server.uri, experiment)


def test_a_run_that_differs_from_what_was_logged_live_is_exported_anew(tmp_path: Path, mlflow_server: Any) -> None:
    from mlflow.tracking import MlflowClient

    experiment = f"differs-{uuid.uuid4().hex[:8]}"
    config = {"exporters": destinations(tmp_path, mlflow_server.uri, experiment, wandb=False)}
    out = tmp_path / "results" / "eval.jsonl"
    run_python(["-c", textwrap.dedent(LATE_AGGREGATE), json.dumps(config), str(out)], tmp_path)
    live = backend_runs(tmp_path, mlflow_server.uri, experiment, wandb=False)
    with open(out, "a") as fh:  # a rollout the live run never logged
        fh.write(json.dumps({"agent_ref": {"name": "a"}, "_ng_task_index": 9, "reward": 0.5}) + "\n")
    out.with_name("eval_aggregate_metrics.json").write_text(
        json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.5}}])
    )
    results = export(out, tmp_path)
    assert all(r["status"] == "EXPORTED" for r in results)
    after = backend_runs(tmp_path, mlflow_server.uri, experiment, wandb=False)
    assert {name: len(ids) for name, ids in after.items()} == {"mlflow": 2, "local": 2}
    [new_ml] = set(after["mlflow"]) - set(live["mlflow"])
    [live_ml] = live["mlflow"]
    assert bookkeeping_of(MlflowClient(mlflow_server.uri).get_run(live_ml).data.tags)["superseded_by"] == new_ml
    [live_local] = live["local"]
    live_json = json.loads((tmp_path / "store" / experiment / live_local / "run.json").read_text())
    assert live_json["superseded_by"] in after["local"]
