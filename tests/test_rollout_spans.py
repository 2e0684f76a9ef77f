"""The span model of a rollout (gym_artifacts.run.rollout_spans) on NeMo Gym 0.7.0's real output and on
any JSON a line may hold."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts.run.rollout_spans import AGENT, LLM, TOOL, failure_trace, rollout_trace, without_nulls
from tests.fixture_paths import NEMO_GYM_FIXTURES

RUN = NEMO_GYM_FIXTURES / "with-failures"


def records(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RUN / name).read_text().splitlines()]


def has_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(v is None or has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(has_null(v) for v in value)
    return False


def test_each_rollout_is_a_span_tree_with_its_own_times_usage_and_tool_calls() -> None:
    for row, record in enumerate(records("rollouts.jsonl")):
        trace = rollout_trace("scope", row, record, fallback_s=1.0)
        response = record["response"]
        root, children = trace.spans[0], trace.spans[1:]
        assert root.kind == AGENT and root.parent_id is None and root.error is None
        assert all(s.parent_id == root.span_id for s in children)
        assert root.start_ns == int(response["created_at"] * 1e9)
        assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in children)
        # inputs: the conversation first, no null field at any depth
        assert next(iter(root.inputs)) == "input" and not has_null(root.inputs)
        assert root.inputs["input"][-1]["content"] == trace.request_preview
        calls = [i for i in response["output"] if i["type"] == "function_call"]
        results = {i["call_id"]: i["output"] for i in response["output"] if i["type"] == "function_call_output"}
        tools = [s for s in children if s.kind == TOOL]
        assert [(s.name, s.inputs) for s in tools] == [(c["name"], json.loads(c["arguments"])) for c in calls]
        assert [s.outputs for s in tools] == [json.loads(results[c["call_id"]]) for c in calls]
        llms = [s for s in children if s.kind == LLM]
        assert len(llms) == len(calls) + 1  # a turn before each tool result, one after the last
        usage = {k: sum(s.usage[k] for s in llms if s.usage) for k in ("input_tokens", "output_tokens")}
        assert usage == {k: response["usage"][k] for k in usage}
        assert trace.feedback == {"reward": record["reward"]}
        assert trace.tags["task"] == str(record["_ng_task_index"])
        assert trace.tags["repeat"] == str(record["_ng_rollout_index"])
        assert llms[-1].output_messages[-1]["content"] == trace.response_preview


def test_failed_rollouts_are_error_traces_with_class_message_and_planned_input() -> None:
    planned = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in records("rollouts_materialized_inputs.jsonl")}
    for index, record in enumerate(records("rollouts_failures.jsonl")):
        key = (record["_ng_task_index"], record["_ng_rollout_index"])
        trace = failure_trace("scope", index, record, planned[key], when_s=100.0)
        assert trace.failed and trace.root.error is not None
        assert record["_ng_failure_message"] in trace.root.error
        assert trace.root.error.startswith(record["_ng_failure_type"])
        assert trace.root.attributes["failure_class"] == record["_ng_failure_class"]
        assert trace.root.inputs["input"] == planned[key]["responses_create_params"]["input"]
        assert trace.tags["repeat"] == str(record["_ng_rollout_index"]) and trace.feedback == {}


def test_ids_are_the_same_for_the_same_rollout_and_scope_only() -> None:
    record = records("rollouts.jsonl")[4]
    first, again = rollout_trace("a", 4, record, 0.0), rollout_trace("a", 4, record, 0.0)
    assert [s.span_id for s in first.spans] == [s.span_id for s in again.spans]
    assert first.trace_id == again.trace_id
    assert rollout_trace("b", 4, record, 0.0).trace_id != first.trace_id
    # the rollout is named by NeMo Gym's task/rollout indices (live and post-run alike), not its row
    assert rollout_trace("a", 5, record, 0.0).trace_id == first.trace_id
    other = {**record, "_ng_rollout_index": record["_ng_rollout_index"] + 1}
    assert rollout_trace("a", 4, other, 0.0).trace_id != first.trace_id
    assert failure_trace("a", 4, {}, None, 0.0).trace_id != first.trace_id
    assert len({s.span_id for s in first.spans}) == len(first.spans)


def test_secrets_are_masked_in_every_span() -> None:
    record = records("rollouts.jsonl")[4]
    record["responses_create_params"]["input"][-1]["content"] = "my key is sk-canary-123456789"
    trace = rollout_trace("a", 0, record, 0.0, frozenset({"sk-canary-123456789"}))
    assert "sk-canary" not in json.dumps([s.__dict__ for s in trace.spans]) + trace.request_preview


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
response_items = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output", "other"])},
    optional={"call_id": st.sampled_from(["a", "b"]), "arguments": json_values, "output": json_values,
              "content": json_values, "name": json_values, "summary": json_values},
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    request=json_values,
    output=st.lists(response_items | json_values, max_size=6),
    extra=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    created=json_values,
)
def test_any_line_gives_a_well_formed_trace(request: Any, output: Any, extra: Any, created: Any) -> None:
    """Whatever a line holds (wrong types, nulls, calls without results): a root span first, every
    child under it, times in order, ids in hex, JSON-serializable payloads."""
    record = {**extra, "responses_create_params": request, "response": {"output": output, "created_at": created}}
    trace = rollout_trace("s", 3, record, 50.0)
    assert trace.spans[0].parent_id is None and len(trace.trace_id) == 32
    assert all(s.parent_id == trace.spans[0].span_id for s in trace.spans[1:])
    assert all(s.start_ns <= s.end_ns <= trace.end_ns for s in trace.spans)
    assert all(len(s.span_id) == 16 and int(s.span_id, 16) for s in trace.spans)
    json.dumps([s.__dict__ for s in trace.spans], allow_nan=True)
    assert not has_null(without_nulls(record))
