"""MLflow rollout traces (``exporters.mlflow.log_traces``), read back with MlflowClient.search_traces."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
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
    """Killed after 200 of 300 traces were committed, inside the third batch's transaction (the
    run exists, no receipt): the rerun finds the run by its identity, keeps the 200 and adds
    the other 100, each with its span and one reward assessment."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import _mlflow_traces as t
        t.BATCH = 100
        real = t._sql_rows
        def counting(store, experiment, info, span):
            # batches of 100 a transaction: rows 0-199 are committed; the kill lands inside the
            # third batch's open transaction (rows 200-249 built), which leaves nothing behind
            if info.tags[t.ROW_TAG] == "250":
                os.kill(os.getpid(), signal.SIGKILL)
            return real(store, experiment, info, span)
        t._sql_rows = counting
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
    assert all(len(t.data.spans) == 1 for t in traces)
    assert len(client.search_traces(locations=[experiment.experiment_id], max_results=500)) == 300


def file_rollouts(fpath: Path) -> Iterator[Any]:
    """The rollouts of a JSONL file as the exporters see them, row numbers from 0."""
    from gym_artifacts._builtin_exporters._rollouts import rollout_from_record

    for row, record in enumerate(json.loads(line) for line in fpath.read_text().splitlines()):
        yield rollout_from_record(row, record)


def _table_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of MLflow's trace tables, sorted, with the folders of the two stores made equal."""
    import sqlite3

    tables = ["trace_info", "trace_tags", "trace_request_metadata", "assessments", "spans",
              "entity_associations"]  # fmt: skip
    with sqlite3.connect(db) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        tables += sorted(n for n in names if "rollup" in n)
        dumped = {}
        for table in tables:
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            if table == "entity_associations":
                rows = [r[1:-1] for r in rows]  # its own random id first, its creation time last
            dumped[table] = sorted(rows, key=repr)
    return dumped


def test_batched_rows_equal_mlflows_own_start_trace_and_log_spans(
    quickstart_run: Path, tmp_path: Path
) -> None:
    """The database-store path writes, table by table and row by row, what MLflow's own
    ``start_trace`` + ``log_spans`` + ``link_traces_to_run`` write for the same traces: if an
    MLflow upgrade changes its rows, this fails instead of leaving half-formed traces."""
    from gym_artifacts._builtin_exporters import _mlflow_traces as t

    stores = {}
    for name in ("mlflow_own", "batched"):
        client = MlflowClient(f"sqlite:///{tmp_path / name}.db")
        experiment_id = client.create_experiment("traces", artifact_location="file:///artifacts")
        run_id = client.create_run(experiment_id).info.run_id
        stores[name] = (client._tracking_client.store, experiment_id, run_id)
    _, experiment_id, run_id = stores["mlflow_own"]
    _, other_experiment, other_run = stores["batched"]
    assert other_experiment == experiment_id
    # the same trace entities into both stores: one run id for both (the batched store's run is
    # named by the link only, rewritten below)
    traces = [t.build_trace(r, experiment_id, run_id, 1_700_000_000_000, frozenset())
              for r in file_rollouts(quickstart_run)][:120]  # fmt: skip
    # one span with token usage and cost (which log_spans sums into the trace's columns)
    info, span = traces[7]
    span_dict = span.to_dict()
    span_dict["attributes"]["mlflow.chat.tokenUsage"] = json.dumps(
        {"input_tokens": 83, "output_tokens": 18, "total_tokens": 101}
    )
    span_dict["attributes"]["mlflow.llm.cost"] = json.dumps(
        {"input_cost": 0.5, "output_cost": 0.25, "total_cost": 0.75}
    )
    traces[7] = (info, type(span).from_dict(span_dict))
    own, _, _ = stores["mlflow_own"]
    for info, _ in traces:
        own.start_trace(info)
    own.log_spans(experiment_id, [span for _, span in traces])
    own.link_traces_to_run([info.trace_id for info, _ in traces[:100]], run_id)
    own.link_traces_to_run([info.trace_id for info, _ in traces[100:]], run_id)
    batched, _, _ = stores["batched"]
    assert t.insert_traces(batched, experiment_id, traces[:50]) == 50
    assert t.insert_traces(batched, experiment_id, traces) == 70  # the first 50 are kept as they are
    for start in (0, 100):
        batched.link_traces_to_run([info.trace_id for info, _ in traces[start : start + 100]], other_run)
    own_rows, batched_rows = _table_rows(tmp_path / "mlflow_own.db"), _table_rows(tmp_path / "batched.db")
    batched_rows["entity_associations"] = [
        tuple(run_id if v == other_run else v for v in row) for row in batched_rows["entity_associations"]
    ]
    assert len(own_rows["trace_info"]) == 120 and len(own_rows["spans"]) == 120
    assert len(own_rows["assessments"]) == 120
    assert [r for r in own_rows["spans"] if 0.75 in r]  # the cost reached the span's columns
    for table, rows in own_rows.items():
        assert batched_rows[table] == rows, table


def test_logging_the_same_traces_twice_keeps_one_of_each(quickstart_run: Path, tmp_path: Path) -> None:
    """A second pass over the same rollouts (a re-export with its receipt lost) adds nothing."""
    from gym_artifacts._builtin_exporters import _mlflow_traces as t

    client = MlflowClient(f"sqlite:///{tmp_path / 'twice.db'}")
    experiment_id = client.create_experiment("traces")
    run_id = client.create_run(experiment_id).info.run_id
    store = client._tracking_client.store
    for _ in range(2):
        assert t.log_rollout_traces(store, experiment_id, run_id, file_rollouts(quickstart_run), 0) == 300
    traces = assert_one_trace_per_rollout(client, run_id, quickstart_run)
    assert all(len(tr.info.assessments) == 1 and len(tr.data.spans) == 1 for tr in traces)


def test_another_mlflow_release_takes_mlflows_own_calls(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch writes MLflow's tables as the tested release lays them out; under any other
    release the traces go through MLflow's own ``start_trace``/``log_spans`` (still exactly once)."""
    import mlflow

    from gym_artifacts._builtin_exporters import _mlflow_traces as t

    def no_batch(*args: Any) -> int:
        raise AssertionError("the batch path ran under an untested MLflow release")

    monkeypatch.setattr(mlflow, "__version__", "3.99.0")
    monkeypatch.setattr(t, "insert_traces", no_batch)
    client = MlflowClient(f"sqlite:///{tmp_path / 'other-release.db'}")
    experiment_id = client.create_experiment("traces")
    run_id = client.create_run(experiment_id).info.run_id
    store = client._tracking_client.store
    rollouts = list(file_rollouts(quickstart_run))[:40]
    for _ in range(2):
        assert t.log_rollout_traces(store, experiment_id, run_id, iter(rollouts), 0) == 40
    traces = all_traces(client, experiment_id, run_id)
    assert len(traces) == len({tr.info.trace_id for tr in traces}) == 40
    assert all(len([a for a in tr.info.assessments if a.name == "reward"]) == 1 for tr in traces)
