"""One NeMo Gym rollout as a trace: a root span, an LLM span per model turn, a TOOL span per call.

The span model every trace backend maps (MLflow span types, OpenInference for Phoenix, LangSmith
run types), built from what a rollout line holds (pure functions, no SDK):

- the root span (``AGENT``): the rollout's request as inputs (conversation first, no ``null``
  fields), its Response as outputs, its other fields as attributes, its start from the Response's
  ``created_at`` and its end from ``completed_at`` (else the record's ``latency_s``);
- an ``LLM`` span per model turn (the model's items of ``output[]`` up to the next tool result):
  the conversation it saw as inputs, its items (reasoning, message, function calls) as outputs,
  the Response's ``usage`` on its last turn (NeMo Gym records one usage per Response, the sum
  of its turns, so it is not split), the model name;
- a ``TOOL`` span per ``function_call``: the parsed arguments as inputs, the matching
  ``function_call_output`` as outputs;
- a failed rollout (``OUT_failures.jsonl``) is a trace whose root span has status ERROR with the
  failure's class, type and message, inputs from its planned input when known.

Every verdict (``reward`` first) is feedback; task, repeat and agent are tags. Trace and span
ids are derived from a scope (the run's content identity and where it goes) and the rollout's
key, so sending the same rollout twice names the same trace and span ids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gym_artifacts.core.jsonio import json_safe, metric_value
from gym_artifacts.core.secrets import redact_text
from gym_artifacts.run.artifacts import agent_label
from gym_artifacts.run.responses_api import last_user_message, response_text

AGENT, LLM, TOOL = "AGENT", "LLM", "TOOL"
REQUEST_KEY, RESPONSE_KEY = "responses_create_params", "response"
# Fields that place a rollout rather than judge it: never feedback.
PLACEMENT_KEYS = frozenset(
    {
        "_ng_task_index",
        "_ng_rollout_index",
        "mask_sample",
        "task_index",
        "repeat",
        "rollout_index",
        "index",
        "timestamp",
        "time",
    }
)
TIMING_PREFIXES = ("latency", "duration", "elapsed")
FAILURE_PREFIX = "_ng_failure_"
TICK_NS = 1_000  # the spacing of spans whose rollout has no known duration (1 microsecond)
MAX_SECONDS = 16_725_225_600.0  # 2500-01-01
MODEL_ITEMS = frozenset({"message", "reasoning", "function_call"})


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
    usage: dict[str, int] | None = None  # input_tokens, output_tokens, total_tokens
    model: str | None = None
    input_messages: list[dict[str, Any]] = field(default_factory=list)  # chat form: role, content
    output_messages: list[dict[str, Any]] = field(default_factory=list)


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


def _seconds(value: Any) -> float | None:
    number = metric_value(value) if not isinstance(value, bool) else None
    # seconds since the epoch that fit OTLP's unsigned 64-bit nanoseconds (before the year 2500)
    return number if number is not None and math.isfinite(number) and 0 < number < MAX_SECONDS else None


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


def _parsed(text: Any, key: str) -> Any:
    """A tool's arguments or result: the JSON object it holds, else ``{key: text}``."""
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            return {key: text}
        return value if isinstance(value, dict) else {key: value}
    return text if isinstance(text, dict) else {key: json_safe(text)}


def _usage(response: dict[str, Any]) -> dict[str, int] | None:
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return None
    out = {}
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    if out and "total_tokens" not in out:
        out["total_tokens"] = out.get("input_tokens", 0) + out.get("output_tokens", 0)
    return out or None


def _turns(output: list[Any]) -> list[list[dict[str, Any]]]:
    """``output[]`` cut into steps: a model turn (its reasoning, messages and calls) or the tool
    results that follow it, in order."""
    steps: list[list[dict[str, Any]]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        is_model = item.get("type", "message") in MODEL_ITEMS
        if steps and (steps[-1][0].get("type", "message") in MODEL_ITEMS) == is_model:
            steps[-1].append(item)
        else:
            steps.append([item])
    return steps


def verdicts_and_extra(
    record: dict[str, Any], skip: Iterable[str]
) -> tuple[dict[str, float], dict[str, Any]]:
    """The numeric verdicts (``reward`` first) and the other fields of a record."""
    skipped = set(skip)
    verdicts: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for key, value in record.items():
        if key in skipped:
            continue
        number = metric_value(value) if not isinstance(value, str | bool) else None
        judges = key not in PLACEMENT_KEYS and not key.startswith(TIMING_PREFIXES)
        if number is not None and judges and math.isfinite(number):
            verdicts[key] = number
        elif value is not None:
            extra[key] = value
    if "reward" in verdicts:
        verdicts = {"reward": verdicts.pop("reward"), **verdicts}
    return verdicts, extra


def _place(record: dict[str, Any], row: int) -> tuple[str, int | None, str, dict[str, str]]:
    task = record.get("_ng_task_index", record.get("task_index", row))
    repeat = record.get("_ng_rollout_index", record.get("repeat"))
    repeat = repeat if isinstance(repeat, int) and not isinstance(repeat, bool) else None
    agent = agent_label(record.get("agent_ref"))
    tags = {"task": str(task)[:250], "agent": agent[:250]}
    if repeat is not None:
        tags["repeat"] = str(repeat)
    return str(task), repeat, agent, tags


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


def rollout_trace(
    scope: str, row: int, record: Any, fallback_s: float, secrets: frozenset[str] = frozenset()
) -> RolloutTrace:
    """The trace of the scored rollout at ``row`` of ``OUT.jsonl``.

    ``fallback_s`` (the run's start) places a rollout whose Response has no ``created_at``, plus
    its row in milliseconds so rows keep their order."""
    record = record if isinstance(record, dict) else {REQUEST_KEY: record}
    trace_id = trace_id_for(scope, f"row/{row}")
    ids = _Ids(trace_id)
    request = record.get(REQUEST_KEY, record.get("request"))
    response = record.get(RESPONSE_KEY)
    response = response if isinstance(response, dict) else {"output_text": response} if response else {}
    verdicts, extra = verdicts_and_extra(record, (REQUEST_KEY, "request", RESPONSE_KEY, "agent_ref"))
    _, _, agent, tags = _place(record, row)
    start_s = (
        _seconds(response.get("created_at")) or _seconds(record.get("timestamp")) or fallback_s + row / 1000
    )
    end_s = _seconds(response.get("completed_at"))
    latency = _seconds(record.get("latency_s"))
    if end_s is None or end_s < start_s:
        end_s = start_s + latency if latency is not None else start_s
    start_ns, end_ns = int(start_s * 1e9), int(end_s * 1e9)

    conversation = conversation_first(request)
    history = (
        list(conversation["input"])
        if isinstance(conversation, dict) and isinstance(conversation.get("input"), list)
        else []
    )
    if isinstance(conversation, dict) and isinstance(conversation.get("input"), str):
        history = [{"role": "user", "content": conversation["input"]}]
    asked = list(history)
    tools = conversation.get("tools") if isinstance(conversation, dict) else None
    output = response.get("output") if isinstance(response.get("output"), list) else []
    steps = _turns(without_nulls(output))
    model = response.get("model") if isinstance(response.get("model"), str) else None
    usage = _usage(response)
    root_id = ids.next()
    # each step (a model turn, one tool call) gets an equal slot of the rollout's duration; with
    # none known, one microsecond each, so the spans keep their order
    slots = sum(1 if step[0].get("type", "message") in MODEL_ITEMS else len(step) for step in steps)
    tick = (end_ns - start_ns) // slots if slots and end_ns > start_ns else TICK_NS
    children: list[Span] = []
    results = {
        str(i.get("call_id")): i.get("output")
        for s in steps
        for i in s
        if i.get("type") == "function_call_output"
    }
    llm_turns = [i for i, s in enumerate(steps) if s[0].get("type", "message") in MODEL_ITEMS]
    at = start_ns
    for index, step in enumerate(steps):
        if step[0].get("type", "message") not in MODEL_ITEMS:
            history.extend(step)
            continue
        turn = llm_turns.index(index) + 1
        inputs: dict[str, Any] = {"input": list(history)}
        if tools:
            inputs["tools"] = tools
        if model:
            inputs = {"model": model, **inputs}
        last = index == llm_turns[-1]
        outputs: dict[str, Any] = {"output": step}
        turn_usage = usage if last else None
        if turn_usage:
            outputs["usage"] = turn_usage
        attributes: dict[str, Any] = {"turn": turn}
        if last and len(llm_turns) > 1 and usage:
            attributes["usage_covers"] = f"all {len(llm_turns)} model turns of the Response"
        reasoning = [_text_of(i) for i in step if i.get("type") == "reasoning"]
        if any(reasoning):
            attributes["reasoning"] = "\n".join(r for r in reasoning if r)
        children.append(
            Span(
                ids.next(),
                root_id,
                model or "model",
                LLM,
                at,
                at + tick,
                inputs,
                outputs,
                attributes,
                usage=turn_usage,
                model=model,
                input_messages=chat_messages(history),
                output_messages=chat_messages(step),
            )
        )
        at += tick
        history.extend(step)
        for call in (i for i in step if i.get("type") == "function_call"):
            call_id = str(call.get("call_id") or call.get("id") or "")
            found = call_id in results
            children.append(
                Span(
                    ids.next(),
                    root_id,
                    str(call.get("name") or "tool"),
                    TOOL,
                    at,
                    at + tick,
                    _parsed(call.get("arguments"), "arguments"),
                    _parsed(results[call_id], "output") if found else None,
                    {"call_id": call_id},
                    error=None if found else "no function_call_output for this call",
                )
            )
            at += tick
    end_ns = max(end_ns, at)
    root_outputs = without_nulls({k: v for k, v in response.items() if k not in ("tools", "instructions")})
    if isinstance(root_outputs, dict) and "output" in root_outputs:
        root_outputs = {
            "output": root_outputs["output"],
            **{k: v for k, v in root_outputs.items() if k != "output"},
        }
    answers = [i for s in steps for i in s if i.get("type", "message") == "message"]
    root = Span(
        root_id,
        None,
        agent,
        AGENT,
        start_ns,
        end_ns,
        conversation,
        root_outputs,
        {**{k: json_safe(v) for k, v in extra.items()}, "row": row, **tags},
        model=model,
        input_messages=chat_messages(asked),
        output_messages=chat_messages(answers[-1:]),
    )
    trace = RolloutTrace(
        trace_id,
        f"row/{row}",
        "rollout",
        [root, *children],
        verdicts,
        {**tags, "row": str(row)},
        last_user_message(request),
        response_text(response),
    )
    return _masked_trace(trace, secrets)


def failure_trace(
    scope: str, index: int, record: Any, planned: Any, when_s: float, secrets: frozenset[str] = frozenset()
) -> RolloutTrace:
    """The ERROR trace of row ``index`` of ``OUT_failures.jsonl``: the failure's class, type and
    message as the root span's status; its planned input (``OUT_materialized_inputs.jsonl``'s line
    for the same task and repeat, when known) as inputs; placed at ``when_s`` (the run's start)."""
    record = record if isinstance(record, dict) else {"failure": record}
    trace_id = trace_id_for(scope, f"failed/{index}")
    failure = {k[len(FAILURE_PREFIX) :]: v for k, v in record.items() if k.startswith(FAILURE_PREFIX)}
    klass = str(failure.get("class") or "failure")
    message = f"{failure.get('type') or klass}: {failure.get('message') or 'no message'}"
    _, _, agent, tags = _place(record, index)
    request = planned.get(REQUEST_KEY) if isinstance(planned, dict) else None
    start_ns = int(when_s * 1e9) + index * 1_000_000
    attributes = {
        "failure_class": klass,
        **{f"failure_{k}": json_safe(v) for k, v in failure.items() if k != "class" and v is not None},
        **{k: json_safe(v) for k, v in record.items() if not k.startswith(FAILURE_PREFIX) and v is not None},
        **tags,
    }
    root = Span(
        _hex_id(8, trace_id, 1),
        None,
        agent,
        AGENT,
        start_ns,
        start_ns,
        conversation_first(request),
        {"error": message},
        attributes,
        error=message,
        input_messages=chat_messages(
            request.get("input")
            if isinstance(request, dict) and isinstance(request.get("input"), list)
            else []
        ),
    )
    trace = RolloutTrace(
        trace_id,
        f"failed/{index}",
        "rollout",
        [root],
        {},
        {**tags, "failed": "true", "failure_class": klass[:250]},
        last_user_message(request),
        message,
    )
    return _masked_trace(trace, secrets)
