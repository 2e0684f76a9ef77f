"""MLflow rollout traces (``exporters.mlflow.log_traces``), read back with MlflowClient.search_traces."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts.export import export_run
from gym_artifacts.exporter import ExportStatus
from gym_artifacts.run import RunArtifacts

REPO = Path(__file__).resolve().parent.parent
CANARY = "sk-traces-canary-8d1f0b"


def traces_cfg(uri: str) -> Any:
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": "traces", "log_traces": True}
    return OmegaConf.create({"exporters": {"mlflow": section}})


def all_traces(client: MlflowClient, experiment_id: str, run_id: str) -> list[Any]:
    traces: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, max_results=100, page_token=token
        )
        traces.extend(page)
        token = page.token
        if not token:
            return traces


def assert_one_trace_per_rollout(client: MlflowClient, run_id: str, quickstart_run: Path) -> list[Any]:
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = all_traces(client, experiment_id, run_id)
    records = [json.loads(line) for line in quickstart_run.read_text().splitlines()]
    by_row = {int(t.info.tags["gym_artifacts.row"]): t for t in traces}
    assert len(traces) == len(records) == len(by_row)  # every rollout once, none twice
    for row, record in enumerate(records):
        trace = by_row[row]
        assert trace.info.request_metadata["mlflow.sourceRun"] == run_id
        [reward] = [a for a in trace.info.assessments if a.name == "reward"]
        assert reward.value == record["reward"]
        assert reward.source.source_type == "CODE"
        assert json.loads(trace.data.request) == record["responses_create_params"]
        assert json.loads(trace.data.response) == record["response"]
        assert trace.info.tags["gym_artifacts.agent"] == record["agent_ref"]["name"]
    return traces


def test_traces_read_back_linked_to_the_run(
    quickstart_run: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLICY_API_KEY", CANARY)
    [result] = export_run(quickstart_run, traces_cfg(tracking_uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(tracking_uri)
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)
    first = traces[0]
    attributes = first.data.spans[0].attributes
    records = [json.loads(line) for line in quickstart_run.read_text().splitlines()]
    # the rollout's other fields ride along as attributes
    assert attributes["gym._ng_environment_server"] in {r["_ng_environment_server"] for r in records}
    assert attributes["gym.mask_sample"] is False
    run = client.get_run(result.backend_run_id)
    assert run.data.params["policy_api_key"] == "***"
    assert all(CANARY not in json.dumps(t.to_dict()) for t in traces)
    [again] = export_run(quickstart_run, traces_cfg(tracking_uri))
    assert again.status is ExportStatus.SKIPPED
    assert len(all_traces(client, run.info.experiment_id, result.backend_run_id)) == 300


def test_sigkilled_export_rerun_leaves_no_duplicate_trace(quickstart_run: Path, tmp_path: Path) -> None:
    """Killed after 200 of 300 traces were written (the run exists, no receipt): the rerun
    finds the run by its identity and rewrites the same trace ids in place."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import _mlflow_traces as t
        real = t.build_trace
        def counting(r, *a, **k):
            if r.row == 250:  # batches of 100: rows 0-199 are in, 200-249 are built, not sent
                os.kill(os.getpid(), signal.SIGKILL)
            return real(r, *a, **k)
        t.build_trace = counting
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "mlflow",
                       "exporters.mlflow.tracking_uri={uri}", "exporters.mlflow.experiment_name=traces",
                       "exporters.mlflow.log_traces=true"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=180)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("mlflow").exists()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("traces")
    assert len(client.search_traces(locations=[experiment.experiment_id], max_results=500)) == 200
    [result] = export_run(quickstart_run, traces_cfg(uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [result.backend_run_id]
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)
    assert all(len(t.info.assessments) == 1 for t in traces)  # the reward, once
    assert len(client.search_traces(locations=[experiment.experiment_id], max_results=500)) == 300
