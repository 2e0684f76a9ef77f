"""A metric has one name in every backend; the only differences are the documented ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from tests.mlflow_store import mlflow_sqlite
from tests.test_wandb import wandb_section
from tests.wandb_records import offline_runs


def mlflow_name(local_name: str) -> str:
    """The documented mapping (docs/coming-from-nemo-gym.md): MLflow forbids '@', written '_at_'; nothing else changes."""
    return local_name.replace("@", "_at_")


@pytest.mark.slow
def test_aggregate_metric_names_agree_across_local_mlflow_and_wandb(quickstart_run: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = mlflow_sqlite(tmp_path / 'names.db')
    cfg = OmegaConf.create(
        {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")},
                       "mlflow": {"enabled": True, "tracking_uri": store},
                       "wandb": wandb_section(tmp_path)}}
    )  # fmt: skip
    results = {r.exporter: r for r in export_run(quickstart_run, cfg)}
    assert {r.status.value for r in results.values()} == {"EXPORTED"}, results
    [run_dir] = (tmp_path / "store" / "default").iterdir()
    local = {
        k: v for k, v in json.loads((run_dir / "summary.json").read_text()).items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "omitted_rows"
    }  # fmt: skip
    # NeMo Gym's own exporter's names; per-task/per-repeat levels are tables, never names here
    assert "key_metrics/weather_simple_agent/mean/reward" in local and "coverage/scored" in local
    assert not any("[" in k or "level_metrics" in k for k in local)
    client = MlflowClient(store)
    run_id = results["mlflow"].backend_run_id
    mlflow_metrics = dict(client.get_run(run_id).data.metrics)  # the headline (the runs list's columns)
    table = json.loads(Path(client.download_artifacts(run_id, "tables/metrics.json", str(tmp_path))).read_text())
    for metric, value in table["data"]:  # every other statistic, under the same name
        assert metric not in mlflow_metrics, metric
        mlflow_metrics[metric] = value
    [wb] = offline_runs(tmp_path / "wb")
    for name, value in local.items():
        assert mlflow_metrics[mlflow_name(name)] == value, name
        assert wb.summary[name] == value, name
