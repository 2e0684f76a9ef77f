"""MLflow's own GenAI path on the same rollouts, beside this project's export (issue 39; the
right-hand column of docs/rollout-traces.md's "What each platform shows" table is what this
test reads back, not a recollection).

MLflow's own path, as a user would take it for rollouts already collected: ``mlflow.genai.evaluate``
with a ``predict_fn`` that replays each rollout under ``@mlflow.trace`` (an ``AGENT`` span; a
``CHAT_MODEL`` span per model turn with the Response's ``usage`` on the last one; a ``TOOL`` span
per function call; a failed rollout raises its failure) and a ``@scorer`` that returns the
rollout's reward. Both land in one SQLite store; each is read back with ``MlflowClient``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.mlflow_store import mlflow_sqlite
from tests.test_mlflow_traces import all_traces, fixture_run, traces_cfg


def mlflow_own_path(uri: str, rollouts: Path) -> str:
    """The rollouts through ``mlflow.genai.evaluate``; returns the evaluation's run id."""
    import mlflow
    from mlflow.entities import SpanType
    from mlflow.genai.scorers import scorer
    from mlflow.tracing.constant import SpanAttributeKey

    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    failures = [json.loads(line) for line in rollouts.with_name("rollouts_failures.jsonl").read_text().splitlines()]

    @mlflow.trace(span_type=SpanType.AGENT, name="agent")
    def predict(row: int) -> Any:
        if row < 0:
            failure = failures[-1 - row]
            raise RuntimeError(f"{failure['_ng_failure_type']}: {failure['_ng_failure_message']}")
        record = records[row]
        output = record["response"]["output"]
        for item in output:
            if item["type"] == "function_call":
                with mlflow.start_span(name="model", span_type=SpanType.CHAT_MODEL) as span:
                    span.set_inputs(record["responses_create_params"]["input"])
                    span.set_outputs(item)
                with mlflow.start_span(name=item["name"], span_type=SpanType.TOOL) as span:
                    span.set_inputs(json.loads(item["arguments"]))
        with mlflow.start_span(name="model", span_type=SpanType.CHAT_MODEL) as span:
            usage = record["response"]["usage"]
            span.set_attribute(SpanAttributeKey.CHAT_USAGE, {
                "input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                "total_tokens": usage["total_tokens"],
            })  # fmt: skip
            span.set_outputs(output[-1])
        return output[-1]

    @scorer
    def reward(inputs: dict[str, Any]) -> float | None:
        row = inputs["row"]
        return None if row < 0 else float(records[row]["reward"])

    data = [{"inputs": {"row": i}} for i in range(len(records))]
    data += [{"inputs": {"row": -1 - j}} for j in range(len(failures))]
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("mlflow-own-genai-path")
    return str(mlflow.genai.evaluate(data=data, predict_fn=predict, scorers=[reward]).run_id)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*type hint is inferred as AnyType:UserWarning")  # MLflow's own modules
def test_mlflow_own_genai_path_beside_this_projects_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_GENAI_EVAL_SKIP_TRACE_VALIDATION", "true")
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    rollouts = fixture_run(tmp_path)
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    ran_ms = int(time.time() * 1000)
    own_id = mlflow_own_path(uri, rollouts)
    [ours] = export_run(rollouts, traces_cfg(uri, "gym-artifacts"))
    assert ours.status is ExportStatus.EXPORTED, ours.reason
    client = MlflowClient(uri)
    own, mine = client.get_run(own_id), client.get_run(ours.backend_run_id)
    views = {"own": (own, all_traces(client, own.info.experiment_id, own_id)),
             "ours": (mine, all_traces(client, mine.info.experiment_id, ours.backend_run_id))}  # fmt: skip

    # the evaluation-runs list: MLflow's path one reward/mean (the 8 scored), ours the headline
    assert own.data.metrics == {"reward/mean": 0.5}
    assert len(mine.data.metrics) <= 12 and mine.data.metrics["coverage/failed"] == 2
    assert mine.data.metrics["example_single_tool_call_simple_agent/mean/reward"] == 0.5
    # traces: all 10 planned rollouts in both, the 2 failed as ERROR with their failure
    for _run, traces in views.values():
        assert len(traces) == 10 and sum(t.info.state.value == "ERROR" for t in traces) == 2
        rewards = [a.value for t in traces for a in t.info.assessments if a.name == "reward" and a.value is not None]
        assert sorted(rewards) == sorted(r["reward"] for r in records)
        tokens = sum((t.info.token_usage or {}).get("total_tokens", 0) for t in traces)
        assert tokens == sum(r["response"]["usage"]["total_tokens"] for r in records)
        for trace in traces:
            types = [s.span_type for s in trace.data.spans]
            assert types[0] == "AGENT" and ("CHAT_MODEL" in types or trace.info.state.value == "ERROR")
    # times: MLflow's path dates the run and every trace when evaluate ran; ours at the rollouts'
    created_ms = {int(r["response"]["created_at"] * 1000) for r in records}
    own_run, own_traces = views["own"]
    assert own_run.info.start_time >= ran_ms and all(t.info.request_time >= ran_ms for t in own_traces)
    assert own_run.info.end_time >= own_run.info.start_time and own.data.params == {}
    assert len(mine.data.params) == 4  # from the rollouts, for a run without a saved config
    my_run, my_traces = views["ours"]
    assert my_run.info.start_time == min(created_ms)
    assert {t.info.request_time for t in my_traces if t.info.state.value == "OK"} <= created_ms
    # a failed rollout: MLflow's path has the exception only; ours the planned input besides
    own_failed = [t for t in own_traces if t.info.state.value == "ERROR"]
    my_failed = [t for t in my_traces if t.info.state.value == "ERROR"]
    assert all("ClientResponseError" in json.dumps([e.attributes for s in t.data.spans for e in s.events], default=str)
               for t in own_failed)  # fmt: skip
    assert all("get the weather" in (t.info.request_preview or "") for t in my_failed)
    assert all("row" in (t.info.request_preview or "") for t in own_failed)
    # MLflow's Tools panel: ours on model calls (mlflow.chat.tools), not set by this replay
    assert all(
        s.attributes.get("mlflow.chat.tools") for t in my_traces for s in t.data.spans if s.span_type == "CHAT_MODEL"
    )
    assert not any(s.attributes.get("mlflow.chat.tools") for t in own_traces for s in t.data.spans)
