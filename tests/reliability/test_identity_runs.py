"""One run identity, one MLflow run: eight copies of a run in eight folders exported at once, and a
``runs/create`` that answers only after the client's timeout (the server still creates the run),
each against a real ``mlflow server``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.contract.hooks import ExportStatus
from tests.mlflow_server import MlflowServer
from tests.processes import reaped
from tests.reliability.faulty_servers import DelayingProxy, delaying_proxy

REPO = Path(__file__).resolve().parents[2]


def runs(uri: str, experiment: str, view: int = ViewType.ACTIVE_ONLY) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else list(client.search_runs([exp.experiment_id], run_view_type=view))


@pytest.mark.slow
def test_eight_copies_in_eight_folders_exported_at_once_make_one_run(
    make_run, own_mlflow_server: MlflowServer
) -> None:
    server = own_mlflow_server.start()
    copies = [make_run() for _ in range(8)]
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    argv = ["-e", "mlflow", "--json", f"exporters.mlflow.tracking_uri={server.uri}",
            "exporters.mlflow.experiment_name=eight"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gym_artifacts.cli", "export", str(run), *argv],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for run in copies
    ]
    results = []
    with reaped(procs):
        for proc in procs:
            out, err = proc.communicate(timeout=400)
            assert proc.returncode == 0, err[-2000:]
            results.extend(json.loads(out))
    assert [r["status"] for r in results] == ["EXPORTED"] * 8  # each folder gets its receipt
    assert len({r["backend_run_id"] for r in results}) == 1
    [only] = runs(server.uri, "eight", ViewType.ALL)
    assert only.info.status == "FINISHED" and bookkeeping_of(only.data.tags)["complete"] == "true"
    assert len(MlflowClient(server.uri).get_metric_history(only.info.run_id, "train/reward")) == 20


@pytest.mark.slow
def test_runs_create_answered_after_the_timeout_still_makes_one_run(
    quickstart_run: Path, own_mlflow_server: MlflowServer
) -> None:
    server = own_mlflow_server.start()
    proxy = DelayingProxy(server.uri, "/runs/create", delay=4.0)
    with delaying_proxy(proxy) as uri:
        cfg = {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "slow",
                                        "export_request_timeout": 1.5, "export_request_retries": 2}}}  # fmt: skip
        started = time.monotonic()
        [result] = export_run(quickstart_run, cfg)
        assert result.status is ExportStatus.EXPORTED, result.reason
        assert time.monotonic() - started < 120
        deadline = time.monotonic() + 30
        while proxy.in_flight and time.monotonic() < deadline:  # the held request has landed
            time.sleep(0.1)
    assert proxy.delayed == 1
    [only] = runs(server.uri, "slow", ViewType.ALL)
    assert only.info.run_id == result.backend_run_id and only.info.status == "FINISHED"
