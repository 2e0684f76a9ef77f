"""NeMo Gym's five module functions make the same backend runs and journal as live_run."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker
from tests.processes import run_bounded

# A NeMo Gym-style eval: module functions, config as a dict with NeMo Gym's own keys.
NEMO_GYM_STYLE = """
import json, sys
{import_line}

global_config_dict = {{
    "output_jsonl_fpath": "results/eval.jsonl",
    "policy_model_name": "tiny-policy",
    "num_repeats": 2,
    "mlflow_tracking_uri": "sqlite:///mlflow.db",
    "mlflow_experiment_name": "ng-style",
    "mlflow_run_name": "ng-run",
    "exporters": {{"local": {{"enabled": True, "root": "store"}}}},
}}
setup_exporters(global_config_dict)
names = sorted(e.name for e in get_exporters())
for step in range(20):
    export_metrics({{"progress/done": step, "reward": step / 20}}, step=step)
export_metrics({{"progress/done": 20}})  # no step: the next one
export_rollouts([{{"task_index": i, "reward": 1.0}} for i in range(3)])
teardown_exporters()
print(json.dumps(names))
"""
IMPORT_LINE = (
    "from gym_artifacts.nemo_gym import setup_exporters, get_exporters, export_metrics, "
    "export_rollouts, teardown_exporters"
)

LIVE_EXPORTERS_STYLE = """
import json
from gym_artifacts.live import live_run

global_config_dict = {
    "output_jsonl_fpath": "results/eval.jsonl",
    "policy_model_name": "tiny-policy",
    "num_repeats": 2,
    "mlflow_tracking_uri": "sqlite:///mlflow.db",
    "mlflow_experiment_name": "ng-style",
    "mlflow_run_name": "ng-run",
    "exporters": {"local": {"enabled": True, "root": "store"}},
}
with live_run(global_config_dict, global_config_dict["output_jsonl_fpath"]) as live:
    names = sorted(e.name for e in live.exporters)
    for step in range(20):
        live.export_metrics({"progress/done": step, "reward": step / 20}, step=step)
    live.export_metrics({"progress/done": 20})
    live.export_rollouts([{"task_index": i, "reward": 1.0} for i in range(3)])
print(json.dumps(names))
"""


def _run(script: str, cwd: Path) -> list[str]:
    cwd.mkdir()
    proc = run_bounded([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _journal(cwd: Path) -> list[tuple[Any, Any]]:
    lines = (cwd / "results" / "eval_metrics.jsonl").read_text().splitlines()
    return [(json.loads(x)["step"], json.loads(x)["metrics"]) for x in lines]


def _local_run(cwd: Path) -> dict[str, Any]:
    marker = read_marker(RunArtifacts.from_path(cwd / "results" / "eval.jsonl").run_id_marker_fpath("local"))
    assert marker is not None
    dpath = cwd / "store" / "default" / marker.run_id
    run_json = json.loads((dpath / "run.json").read_text())
    metrics = [json.loads(x) for x in (dpath / "metrics.jsonl").read_text().splitlines()]
    return {
        "status": run_json["status"],
        "config": json.loads((dpath / "config.json").read_text()),
        "metrics": [(m["step"], m["metrics"]) for m in metrics],
        "rollouts": (dpath / "rollouts.jsonl").read_text().splitlines() if (dpath / "rollouts.jsonl").exists() else None,
    }


def _mlflow_run(cwd: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "ng-style"]
    [run] = client.search_runs([experiment.experiment_id])
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }
    return {"status": run.info.status, "params": run.data.params, "history": history}


@pytest.mark.slow
def test_module_functions_match_live_run(tmp_path: Path) -> None:
    script = textwrap.dedent(NEMO_GYM_STYLE.format(import_line=IMPORT_LINE))
    # the NeMo Gym-style body names nothing of ours but the import line
    body = script.replace(IMPORT_LINE, "")
    assert "gym_artifacts" not in body and "live_run" not in body
    ng_names = _run(script, tmp_path / "ng")
    live_names = _run(textwrap.dedent(LIVE_EXPORTERS_STYLE), tmp_path / "live")
    assert ng_names == live_names == ["local", "mlflow"]
    ng, live = tmp_path / "ng", tmp_path / "live"
    assert _journal(ng) == _journal(live)
    assert [s for s, _ in _journal(ng)] == list(range(21))
    ng_local, live_local = _local_run(ng), _local_run(live)
    assert ng_local == live_local
    assert ng_local["status"] == "FINISHED"
    # live params are the eval's config, not this tool's own settings
    assert ng_local["config"] == {
        "output_jsonl_fpath": "results/eval.jsonl", "policy_model_name": "tiny-policy", "num_repeats": 2,
    }  # fmt: skip
    ng_ml, live_ml = _mlflow_run(ng), _mlflow_run(live)
    assert ng_ml == live_ml
    assert ng_ml["status"] == "FINISHED"
    assert not any(k.startswith(("exporters", "mlflow_")) for k in ng_ml["params"])
    assert [s for s, _ in ng_ml["history"]["progress/done"]] == list(range(21))


def test_calls_before_setup_and_after_teardown_are_noops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_artifacts import nemo_gym
    monkeypatch.chdir(tmp_path)
    nemo_gym.export_metrics({"a": 1}, step=0)
    nemo_gym.export_rollouts([{"x": 1}])
    assert nemo_gym.get_exporters() == []
    nemo_gym.teardown_exporters()
    assert nemo_gym.setup_exporters({"policy_model_name": "x"}) == []  # a server's config: nothing to open
    cfg = {"output_jsonl_fpath": str(tmp_path / "o.jsonl"), "exporters": {"local": {"enabled": True, "root": "s"}}}
    assert [e.name for e in nemo_gym.setup_exporters(cfg)] == ["local"]
    nemo_gym.export_metrics({"a": 1}, step=0)
    nemo_gym.teardown_exporters()
    nemo_gym.teardown_exporters()  # again: nothing left to end
    assert nemo_gym.get_exporters() == []
    assert [json.loads(x)["step"] for x in (tmp_path / "o_metrics.jsonl").read_text().splitlines()] == [0]


def test_interpreter_exit_tears_down(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from gym_artifacts.nemo_gym import setup_exporters, export_metrics
        setup_exporters({"output_jsonl_fpath": "o.jsonl", "exporters": {"local": {"enabled": True, "root": "s"}}})
        for step in range(5):
            export_metrics({"a": step}, step=step)
        """
    )
    proc = run_bounded([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [run_dir] = (tmp_path / "s" / "default").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "FINISHED"  # as NeMo Gym's exit hook
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 5
