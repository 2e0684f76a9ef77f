"""An eval that calls ``setup_exporters`` (or enters ``live_run`` by hand) and
never tears down still delivers to MLflow and W&B when the interpreter exits: the exit-time
teardown runs before the interpreter's shutdown forbids new exit hooks and thread pools."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.processes import run_bounded
from tests.wandb_records import offline_runs

REPO = Path(__file__).resolve().parents[2]

EVAL = textwrap.dedent("""
    import sys
    from gym_artifacts import nemo_gym
    from gym_artifacts.live import live_run
    work, how = sys.argv[1], sys.argv[2]
    config = {
        "output_jsonl_fpath": f"{work}/run/eval.jsonl",
        "exporters": {
            "mlflow": {"enabled": True, "tracking_uri": f"sqlite:///{work}/mlflow.db"},
            "wandb": {"enabled": True, "mode": "offline", "dir": f"{work}/wb", "project": "exit"},
        },
    }
    if how == "setup_exporters":
        nemo_gym.setup_exporters(config)
        for step in range(5):
            nemo_gym.export_metrics({"reward": step / 5}, step=step)
    else:  # the context entered by hand, never left
        context = live_run(config, config["output_jsonl_fpath"])  # kept: never collected
        live = context.__enter__()
        for step in range(5):
            live.export_metrics({"reward": step / 5}, step=step)
    print("eval done", flush=True)
    # no teardown: the interpreter exits here
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["setup_exporters", "live_run"])
def test_exit_without_teardown_delivers_to_mlflow_and_wandb(tmp_path: Path, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(REPO)
    proc = run_bounded([sys.executable, "-c", EVAL, str(tmp_path), how], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "eval done" in proc.stdout, proc.stderr[-3000:]
    assert "after shutdown" not in proc.stderr, proc.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, proc.stderr[-3000:]
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "reward")] == list(range(5))
    assert runs[0].info.status in ("FINISHED", "KILLED")
    [wb_run] = offline_runs(tmp_path / "wb")  # read back from its .wandb file
    assert wb_run.steps == list(range(5)) and wb_run.summary["reward"] == 0.8
    assert wb_run.exit_code is not None  # the run was finished, not cut off
