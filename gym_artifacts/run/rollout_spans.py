"""One rollout as a trace: a root span, an LLM span per model call, a TOOL span per tool call.

The span model every trace backend maps (MLflow span types, OpenInference for Phoenix, LangSmith
run types), built from the rollout's trajectory (``gym_artifacts.run.trajectory``: NeMo Gym's
``ng_trajectory`` evidence when the line has it, its Responses objects otherwise, the planned
input of a failed rollout). Pure functions, no SDK.

- the root span (``AGENT``): the rollout's request as inputs (conversation first, no ``null``
  fields), its Response as outputs (a failure: the failure), its other fields as attributes;
  its start and end are the trajectory's (its first step's start and last step's end, else the
  Response's ``created_at`` / ``completed_at`` / ``latency_s`` / ``ng_perf.total_latency_ms``);
- an ``LLM`` span per model call: the conversation it saw as inputs, its items as outputs, the
  tools offered (``tools``), its tokens (``usage``: input, output, total, reasoning, cached), the
  model, and as attributes its finish reason, error category, time to first token. From
  ``ng_trajectory`` each call has its own times and tokens; from a Response alone the one
  ``usage`` (the sum of its turns) sits on the last call (attribute ``usage_covers``);
- a ``TOOL`` span per tool call: the parsed arguments as inputs, the result as outputs, its
  status (an ERROR span when it failed or has no result) and its own times when NeMo Gym timed it;
- a failed rollout (``OUT_failures.jsonl``) is a trace whose root span has status ERROR with the
  failure's class, type and message, inputs from its planned input when known.

A span whose source has no time is placed, never measured: the steps of a rollout without step
times share its known duration equally (attribute ``times: "placed"``), or sit 1 microsecond
apart when even the rollout's duration is unknown; a rollout with no time at all starts at the
caller's ``fallback_s`` plus its row in milliseconds (keeps rows in order).

Every verdict (``reward`` first, ``gym_artifacts.run.trajectory.rollout_verdicts``) is feedback;
task, repeat and agent are tags. Trace and span ids are derived from a scope (the run's content
identity and where it goes) and the rollout's key, so sending the same rollout twice names the
same trace and span ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gym_artifacts.core.jsonio import json_safe
from gym_artifacts.core.secrets import redact_text
from gym_artifacts.run.trajectory import (
    ModelCall,
    ToolCall,
    Trajectory,
    arguments_object,
    failed_trajectory,
    parsed_object,
    trajectory_of,
)

AGENT, LLM, TOOL = "AGENT", "LLM", "TOOL"
TICK_NS = 1_000  # the spacing of spans whose rollout has no known duration (1 microsecond)


def _hex_id(nbytes: int, *parts: object) -> str:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    value = digest[:nbytes]
    if not any(value):  # OTLP refuses an all-zero id
        value = b"\x01" + value[1:]
    return value.hex()


def trace_id_for(scope: str, key: str) -> str:
    """The 32-hex trace id of rollout ``key`` (``row/3``, ``failed/0``) in ``scope``."""
    return _hex_id(16, "gym-artifacts/trace", scope, key)


@dataclass(frozen=True)
class Span:
    """One span: ids in hex (16 digits), times in ns since the epoch, JSON-ready payloads."""

    span_id: str
    parent_id: str | None
    name: str
    kind: str  # AGENT, LLM or TOOL
    start_ns: int
    end_ns: int
    inputs: Any
    outputs: Any
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the status message of a failed span
    usage: dict[str, int] | None = None  # input, output, total (reasoning, cached) tokens
    model: str | None = None
    input_messages: list[dict[str, Any]] = field(default_factory=list)  # chat form: role, content
    output_messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)  # the tools offered the model (Responses API shape)


@dataclass(frozen=True)
class RolloutTrace:
    """One rollout's trace: its spans (root first), feedback, tags and previews."""

    trace_id: str
    key: str  # row/N for a scored rollout, failed/N for a row of the failures sidecar
    name: str
    spans: list[Span]
    feedback: dict[str, float]
    tags: dict[str, str]
    request_preview: str
    response_preview: str

    @property
    def root(self) -> Span:
        return self.spans[0]

    @property
    def failed(self) -> bool:
        return self.root.error is not None

    @property
    def start_ns(self) -> int:
        return self.root.start_ns

    @property
    def end_ns(self) -> int:
        return self.root.end_ns


def without_nulls(value: Any) -> Any:
    """``value`` with every ``null`` object field left out, at any depth (JSON-safe)."""
    value = json_safe(value)
    stack = [value]
    while stack:  # iterative: a deep record must not hit the recursion limit
        node = stack.pop()
        if isinstance(node, dict):
            for k in [k for k, v in node.items() if v is None]:
                del node[k]
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    return value


def conversation_first(request: Any) -> Any:
    """The request without nulls, its ``input`` (the conversation) the first key."""
    clean = without_nulls(request)
    if not isinstance(clean, dict) or "input" not in clean:
        return clean
    return {"input": clean["input"], **{k: v for k, v in clean.items() if k != "input"}}


def _text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    summary = item.get("summary")  # a reasoning item
    if isinstance(summary, list):
        return " ".join(
            str(p["text"]) for p in summary if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def chat_messages(items: Iterable[Any]) -> list[dict[str, Any]]:
    """Responses API items in chat form (role, content; tool calls and tool results)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": str(item.get("role") or "assistant"), "content": _text_of(item)})
        elif kind == "reasoning":
            messages.append({"role": "assistant", "content": "", "reasoning": _text_of(item)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "name": str(item.get("name") or ""),
                "arguments": str(item.get("arguments") or ""),
            }
            if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    "content": output if isinstance(output, str) else json.dumps(json_safe(output)),
                }
            )
    return messages


class _Ids:
    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return _hex_id(8, self.trace_id, self.count)


def _mask(value: Any, secrets: frozenset[str]) -> Any:
    if not secrets:
        return value
    return json.loads(redact_text(json.dumps(value, default=str), secrets))


def _masked_trace(trace: RolloutTrace, secrets: frozenset[str]) -> RolloutTrace:
    """The trace with every known secret value replaced in its text (one JSON pass a span)."""
    if not secrets:
        return trace
    spans = [
        Span(
            **{
                **s.__dict__,
                **_mask(
                    {
                        k: getattr(s, k)
                        for k in (
                            "name",
                            "inputs",
                            "outputs",
                            "attributes",
                            "error",
                            "input_messages",
                            "output_messages",
                            "tools",
                        )
                    },
                    secrets,
                ),
            }
        )
        for s in trace.spans
    ]
    return RolloutTrace(
        trace.trace_id,
        trace.key,
        trace.name,
        spans,
        trace.feedback,
        _mask(trace.tags, secrets),
        redact_text(trace.request_preview, secrets),
        redact_text(trace.response_preview, secrets),
    )


def _span_times(trajectory: Trajectory, start_ns: int, end_ns: int) -> list[tuple[int, int, bool]]:
    """``(start, end, measured)`` of each step: its own times when known, else an equal slot of
    the rollout's known duration, else 1 microsecond after the previous step."""
    steps = trajectory.steps
    unknown = sum(1 for s in steps if s.start_s is None or s.end_s is None)
    tick = (end_ns - start_ns) // unknown if unknown and end_ns > start_ns else TICK_NS
    out: list[tuple[int, int, bool]] = []
    at = start_ns
    for step in steps:
        if step.start_s is not None and step.end_s is not None:
            begin, finish = int(step.start_s * 1e9), int(step.end_s * 1e9)
            out.append((begin, max(begin, finish), True))
            at = max(at, finish)
        else:
            out.append((at, at + tick, False))
            at += tick
    return out


def _llm_span(span_id: str, root_id: str, call: ModelCall, turn: int, calls: int, tools: list[Any],
              times: tuple[int, int, bool]) -> Span:  # fmt: skip
    history = without_nulls(call.inputs)
    outputs = without_nulls(call.outputs)
    inputs: dict[str, Any] = {"input": history}
    if tools:
        inputs["tools"] = tools
    if call.model:
        inputs = {"model": call.model, **inputs}
    usage = call.usage.as_dict() if call.usage else None
    span_outputs: dict[str, Any] = {"output": outputs}
    if usage:
        span_outputs["usage"] = usage
    attributes: dict[str, Any] = {"turn": turn}
    if usage and call.usage_scope == "response" and calls > 1:
        attributes["usage_covers"] = f"all {calls} model turns of the Response"
    for name in ("finish_reason", "error_category", "ttft_ms", "status", "call_id"):
        value = getattr(call, name)
        if value is not None:
            attributes[name] = value
    if not times[2]:
        attributes["times"] = "placed"
    reasoning = [_text_of(i) for i in outputs if isinstance(i, dict) and i.get("type") == "reasoning"]
    if any(reasoning):
        attributes["reasoning"] = "\n".join(r for r in reasoning if r)
    failed = call.error_category is not None or call.status in ("failed", "cancelled")
    return Span(
        span_id, root_id, call.model or "model", LLM, times[0], times[1], inputs, span_outputs, attributes,
        error=f"model call {call.status or 'failed'}: {call.error_category or 'error'}" if failed else None,
        usage=usage, model=call.model, input_messages=chat_messages(history),
        output_messages=chat_messages(outputs), tools=tools,
    )  # fmt: skip


def _tool_span(span_id: str, root_id: str, call: ToolCall, times: tuple[int, int, bool]) -> Span:
    attributes: dict[str, Any] = {"call_id": call.call_id, "status": call.status}
    if not times[2]:
        attributes["times"] = "placed"
    failed = call.status in ("failed", "timeout", "cancelled", "missing")
    return Span(
        span_id, root_id, call.name, TOOL, times[0], times[1], arguments_object(call.arguments),
        parsed_object(call.result, "output") if call.has_result else None, attributes,
        error=(call.error or f"tool call {call.status}") if failed else None,
    )  # fmt: skip


def _answer_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    items = [i for c in trajectory.model_calls for i in c.outputs if i.get("type", "message") == "message"]
    return chat_messages(without_nulls(items[-1:]))


def trajectory_trace(
    scope: str, trajectory: Trajectory, fallback_s: float, secrets: frozenset[str] = frozenset()
) -> RolloutTrace:
    """The trace of one trajectory (a scored or a failed rollout); ``fallback_s`` places a
    rollout whose sources hold no time (see the module doc)."""
    trace_id = trace_id_for(scope, trajectory.key)
    ids = _Ids(trace_id)
    root_id = ids.next()
    start_s = trajectory.start_s if trajectory.start_s is not None else fallback_s + trajectory.row / 1000
    end_s = trajectory.end_s if trajectory.end_s is not None and trajectory.start_s is not None else start_s
    start_ns, end_ns = int(start_s * 1e9), int(end_s * 1e9)
    times = _span_times(trajectory, start_ns, end_ns)
    tools = without_nulls(trajectory.tools)
    calls = len(trajectory.model_calls)
    children: list[Span] = []
    turn = 0
    for step, when in zip(trajectory.steps, times, strict=True):
        if isinstance(step, ModelCall):
            turn += 1
            children.append(_llm_span(ids.next(), root_id, step, turn, calls, tools, when))
        else:
            children.append(_tool_span(ids.next(), root_id, step, when))
    end_ns = max([end_ns, *(s.end_ns for s in children)])
    start_ns = min([start_ns, *(s.start_ns for s in children)])
    tags = {"task": trajectory.task[:250], "agent": trajectory.agent[:250]}
    if trajectory.repeat is not None:
        tags["repeat"] = str(trajectory.repeat)
    attributes: dict[str, Any] = {k: json_safe(v) for k, v in trajectory.extra.items()}
    if trajectory.perf:
        attributes["ng_perf"] = json_safe(trajectory.perf)
    attributes["source"] = trajectory.source
    if trajectory.start_s is None:
        attributes["times"] = "placed"
    failure = trajectory.failure
    if failure is not None:
        outputs: Any = {"error": failure.text}
        attributes["failure_class"] = failure.klass
        attributes.update({f"failure_{k}": json_safe(v) for k, v in failure.fields.items() if k != "class"})
        tags = {**tags, "failed": "true", "failure_class": failure.klass[:250]}
    else:
        outputs = without_nulls(
            {k: v for k, v in trajectory.response.items() if k not in ("tools", "instructions")}
        )
        if isinstance(outputs, dict) and "output" in outputs:
            outputs = {"output": outputs["output"], **{k: v for k, v in outputs.items() if k != "output"}}
        attributes["row"] = trajectory.row
        tags = {**tags, "row": str(trajectory.row)}
    usage = trajectory.usage
    root = Span(
        root_id, None, trajectory.agent, AGENT, start_ns, end_ns,
        conversation_first(trajectory.request), outputs,
        {**attributes, **{k: v for k, v in tags.items() if k not in ("row", "failed")}},
        error=failure.text if failure is not None else None, usage=usage or None, model=trajectory.model,
        input_messages=chat_messages(without_nulls(_request_items(trajectory.request))),
        output_messages=[] if failure is not None else _answer_messages(trajectory), tools=tools,
    )  # fmt: skip
    trace = RolloutTrace(
        trace_id, trajectory.key, "rollout", [root, *children], dict(trajectory.verdicts), tags,
        trajectory.prompt, trajectory.answer,
    )  # fmt: skip
    return _masked_trace(trace, secrets)


def _request_items(request: Any) -> list[Any]:
    if isinstance(request, dict) and isinstance(request.get("input"), str):
        return [{"role": "user", "content": request["input"]}]
    items = request.get("input") if isinstance(request, dict) else None
    return items if isinstance(items, list) else []


def rollout_trace(
    scope: str, row: int, record: Any, fallback_s: float, secrets: frozenset[str] = frozenset()
) -> RolloutTrace:
    """The trace of the scored rollout at ``row`` of ``OUT.jsonl``."""
    return trajectory_trace(scope, trajectory_of(row, record), fallback_s, secrets)


def failure_trace(
    scope: str, index: int, record: Any, planned: Any, when_s: float, secrets: frozenset[str] = frozenset()
) -> RolloutTrace:
    """The ERROR trace of row ``index`` of ``OUT_failures.jsonl`` with its planned input, placed at
    ``when_s`` (the run's start) plus its index in milliseconds: a failed rollout has no time."""
    return trajectory_trace(scope, failed_trajectory(index, record, planned), when_s, secrets)
