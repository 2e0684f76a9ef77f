"""What MLflow shows of an exported NeMo Gym run (issue 39): a short evaluation-runs list (headline
metrics only, every other statistic in a table artifact), coverage that adds up, and model-call
spans in MLflow's own conventions (span types, its tool format for the Tools panel, tokens,
OpenTelemetry ``gen_ai.*`` attributes). Read back from a SQLite store with MlflowClient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from exporters._mlflow_traces import span_attributes
from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.rollout_spans import AGENT, LLM, TOOL, rollout_trace
from tests.mlflow_store import mlflow_sqlite
from tests.nemo_gym_observability import observability_run
from tests.test_mlflow_traces import fixture_run

HEADLINE_MAX = 12


def _export(run: Path, tmp_path: Path) -> tuple[MlflowClient, object]:
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create({"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "e"}}})
    [result] = export_run(run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(uri)
    return client, client.get_run(result.backend_run_id)


def test_runs_list_gets_headline_metrics_and_every_statistic_goes_to_a_table(tmp_path: Path) -> None:
    run_path = fixture_run(tmp_path)
    client, run = _export(run_path, tmp_path)
    metrics = run.data.metrics  # type: ignore[attr-defined]
    assert 0 < len(metrics) <= HEADLINE_MAX, sorted(metrics)
    agent = "example_single_tool_call_simple_agent"
    assert metrics[f"{agent}/mean/reward"] == 0.5
    # coverage adds up: scored + failed + missing (no result at all) = planned
    got = {k: metrics[f"coverage/{k}"] for k in ("expected", "scored", "failed", "missing")}
    assert got == {"expected": 10, "scored": 8, "failed": 2, "missing": 0}
    # every other statistic of the aggregate: a row of the metrics table, same value
    table = Path(client.download_artifacts(run.info.run_id, "tables/metrics.json", str(tmp_path / "dl")))  # type: ignore[attr-defined]
    data = json.loads(table.read_text())
    assert data["columns"] == ["metric", "value"]
    rows = dict(data["data"])
    aggregate = json.loads((run_path.parent / "rollouts_aggregate_metrics.json").read_text())[0]["agent_metrics"]
    numeric = {k: v for k, v in aggregate.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    for key, value in numeric.items():
        assert {**rows, **metrics}[f"{agent}/{key}"] == pytest.approx(value), key
    tag = json.loads(run.data.tags["mlflow.loggedArtifacts"])  # type: ignore[attr-defined]
    assert {"path": "tables/metrics.json", "type": "table"} in tag


def test_model_call_spans_use_mlflows_tool_format_types_and_gen_ai_attributes(tmp_path: Path) -> None:
    record = json.loads(observability_run(tmp_path / "run").read_text().splitlines()[-1])
    trace = rollout_trace("s", 0, record, 1.0)
    kinds = {s.kind: span_attributes(trace, s) for s in trace.spans}
    llm, tool, root = kinds[LLM], kinds[TOOL], kinds[AGENT]
    assert (root["mlflow.spanType"], llm["mlflow.spanType"], tool["mlflow.spanType"]) == ("AGENT", "CHAT_MODEL", "TOOL")
    tools = llm["mlflow.chat.tools"]
    assert tools == [
        {"type": "function", "function": {"name": "get_weather", "description": "", "strict": True,
                                          "parameters": record["responses_create_params"]["tools"][0]["parameters"]}}
    ]  # fmt: skip
    assert set(llm["mlflow.chat.tokenUsage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert llm["gen_ai.operation.name"] == "chat" and llm["gen_ai.request.model"] == "fake-model"
    assert llm["gen_ai.usage.input_tokens"] > 0 and llm["gen_ai.usage.output_tokens"] > 0
    assert llm["gen_ai.response.finish_reasons"] in (["stop"], ["tool_calls"])
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["gen_ai.tool.name"] == "get_weather"
    assert tool["gen_ai.tool.call.id"]
    assert root["gen_ai.operation.name"] == "invoke_agent"
    assert root["gen_ai.agent.name"] == "example_single_tool_call_simple_agent"
