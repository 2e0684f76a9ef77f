"""One rollout as one trajectory: the single model every backend, the report and compare read.

A rollout is read from the richest source its line has:

1. NeMo Gym's rollout evidence (``observability_enabled: true``, NeMo Gym 0.5+): ``ng_trajectory``
   (``nemo_gym.rollout_observability.TrajectoryRecord``) holds every model call with its request,
   response, wall-clock ``started_at`` / ``completed_at``, ``duration_ms``, ``token_stats``
   (prompt, completion, reasoning, cached, total) and ``response_metadata`` (model, finish
   reason, error category, time to first token), and every tool call with its timing, status and
   output; ``ng_perf`` is the rollout's own summary (turns, tool calls, tokens, latency).
2. Otherwise the Responses API objects: the request (``responses_create_params``) and the
   Response, whose ``output[]`` is cut into model turns and tool results; one ``usage`` for the
   whole Response (NeMo Gym sums its turns), so it sits on the last model call, marked as the
   Response's (``usage_scope``); times from ``created_at`` / ``completed_at`` / ``latency_s``.
3. A failed rollout (a row of ``OUT_failures.jsonl``) is its failure and its planned input (the
   line of ``OUT_materialized_inputs.jsonl`` for the same task and repeat).

A step's or rollout's time is ``None`` when the source does not say it: nothing here invents a
time (a backend that must place a span decides, and says so).

``rollout_verdicts`` is the one definition of a rollout's verdicts: what NeMo Gym's own
aggregate averages (a top-level field not starting with ``_``, a number or a boolean as 0/1),
without placement and timing fields, finite only (an infinity or NaN is no verdict: no tracker
carries one), ``reward`` first. Pure functions, no SDK.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.jsonio import json_safe, metric_value
from gym_artifacts.run.artifacts import agent_label
from gym_artifacts.run.responses_api import last_user_message, response_text

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts

REQUEST_KEY, RESPONSE_KEY = "responses_create_params", "response"
TRAJECTORY_KEY, PERF_KEY = "ng_trajectory", "ng_perf"
FAILURE_PREFIX = "_ng_failure_"
# Fields that place a rollout rather than judge it: never verdicts.
PLACEMENT_KEYS = frozenset(
    {"_ng_task_index", "_ng_rollout_index", "mask_sample", "task_index", "repeat", "rollout_index",
     "index", "timestamp", "time"}
)  # fmt: skip
TIMING_PREFIXES = ("latency", "duration", "elapsed")
MODEL_ITEMS = frozenset({"message", "reasoning", "function_call"})
MAX_SECONDS = 16_725_225_600.0  # 2500-01-01: past it a time is not a time (OTLP's 64-bit ns)
# ng_trajectory's own keys that are evidence, not fields of the rollout's judgement
EVIDENCE_KEYS = (TRAJECTORY_KEY, PERF_KEY, "ng_model_call_capture", "ng_agent_observations")


def rollout_verdicts(record: Any, skip: Iterable[str] = ()) -> dict[str, float]:
    """A rollout's verdicts (the module doc's definition), ``reward`` first; ``skip``: fields
    that hold the request or response whatever they are."""
    if not isinstance(record, dict):
        return {}
    return verdicts_and_extra(record, skip)[0]


def verdicts_and_extra(
    record: dict[str, Any], skip: Iterable[str]
) -> tuple[dict[str, float], dict[str, Any]]:
    """The verdicts of ``record`` (``reward`` first) and its other non-null fields, ``skip`` left out."""
    skipped = set(skip)
    verdicts: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for key, value in record.items():
        if key in skipped:
            continue
        number = None if isinstance(value, str) else metric_value(value)
        judges = not key.startswith("_") and key not in PLACEMENT_KEYS and not key.startswith(TIMING_PREFIXES)
        if number is not None and judges and math.isfinite(number):
            verdicts[key] = number
        elif value is not None:
            extra[key] = value
    if "reward" in verdicts:
        verdicts = {"reward": verdicts.pop("reward"), **verdicts}
    return verdicts, extra


def seconds(value: Any) -> float | None:
    """Seconds since the epoch, or None for anything that is not a plausible time."""
    number = None if isinstance(value, bool | str) else metric_value(value)
    return number if number is not None and math.isfinite(number) and 0 < number < MAX_SECONDS else None


def _duration_s(value_ms: Any) -> float | None:
    number = None if isinstance(value_ms, bool | str) else metric_value(value_ms)
    return number / 1000 if number is not None and math.isfinite(number) and 0 <= number < 1e15 else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Usage:
    """Token counts of one model call (None: not reported, never 0)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None

    def as_dict(self) -> dict[str, int]:
        """The reported counts; ``total_tokens`` filled from input + output when both are known."""
        out = {k: v for k, v in self.__dict__.items() if v is not None}
        if "total_tokens" not in out and self.input_tokens is not None and self.output_tokens is not None:
            out["total_tokens"] = self.input_tokens + self.output_tokens
        return out

    @staticmethod
    def of(values: dict[str, Any]) -> Usage | None:
        usage = Usage(**{k: _count(values.get(k)) for k in Usage.__dataclass_fields__})
        return usage if usage.as_dict() else None


def usage_of_response(response: Any) -> Usage | None:
    """A Responses API ``usage`` (or chat completions' ``prompt_tokens``/``completion_tokens``)."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    details_in = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    details_out = usage.get("output_tokens_details") or usage.get("completion_tokens_details") or {}
    details_in = details_in if isinstance(details_in, dict) else {}
    details_out = details_out if isinstance(details_out, dict) else {}
    return Usage.of(
        {
            "input_tokens": usage.get("input_tokens", usage.get("prompt_tokens")),
            "output_tokens": usage.get("output_tokens", usage.get("completion_tokens")),
            "total_tokens": usage.get("total_tokens"),
            "reasoning_tokens": details_out.get("reasoning_tokens"),
            "cached_tokens": details_in.get("cached_tokens"),
        }
    )


@dataclass(frozen=True)
class ModelCall:
    """One call of the model: what it saw (Responses API items), what it gave, tokens and times."""

    inputs: list[Any]
    outputs: list[dict[str, Any]]
    model: str | None = None
    usage: Usage | None = None
    usage_scope: str = "call"  # "call", or "response": the whole Response's sum, on its last call
    start_s: float | None = None
    end_s: float | None = None
    finish_reason: str | None = None
    error_category: str | None = None
    ttft_ms: float | None = None
    status: str | None = None
    call_id: str | None = None

    kind = "model"


@dataclass(frozen=True)
class ToolCall:
    """One tool call: its arguments (as the model wrote them), result, status and times."""

    call_id: str
    name: str
    arguments: Any
    result: Any = None
    status: str = "unknown"  # completed, failed, timeout, cancelled, incomplete, unknown, missing
    error: str | None = None
    start_s: float | None = None
    end_s: float | None = None

    kind = "tool"

    @property
    def has_result(self) -> bool:
        return self.status != "missing"


Step = ModelCall | ToolCall


@dataclass(frozen=True)
class Failure:
    """Why a rollout failed: NeMo Gym's ``_ng_failure_*`` fields."""

    klass: str
    type: str | None
    message: str | None
    fields: dict[str, Any]

    @property
    def text(self) -> str:
        return f"{self.type or self.klass}: {self.message or 'no message'}"


@dataclass(frozen=True)
class Trajectory:
    """One rollout: where it sits, what was asked, every step, its verdicts, failure and times."""

    key: str  # rollout_key: task/T/rollout/R (failed/...), else row/N or failed/N
    row: int
    task: str
    repeat: int | None
    agent: str
    request: Any  # the Responses API request (or the planned one of a failed rollout)
    response: dict[str, Any]
    steps: tuple[Step, ...]
    verdicts: dict[str, float]
    extra: dict[str, Any]
    source: str  # "ng_trajectory", "responses" or "planned"
    start_s: float | None = None
    end_s: float | None = None
    failure: Failure | None = None
    perf: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def reward(self) -> float | None:
        return self.verdicts.get("reward")

    @property
    def prompt(self) -> str:
        """The last user turn of the request."""
        return last_user_message(self.request)

    @property
    def answer(self) -> str:
        """The final answer: the Response's message text (a failed rollout: its failure)."""
        if self.failure is not None:
            return self.failure.text
        text = response_text(self.response)
        if text or self.response:
            return text
        messages = [i for s in self.model_calls for i in s.outputs if i.get("type", "message") == "message"]
        return response_text({"output": messages[-1:]})

    @property
    def model_calls(self) -> list[ModelCall]:
        return [s for s in self.steps if isinstance(s, ModelCall)]

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [s for s in self.steps if isinstance(s, ToolCall)]

    @property
    def tools(self) -> list[Any]:
        """The tool list the request offered the model."""
        tools = self.request.get("tools") if isinstance(self.request, dict) else None
        return list(tools) if isinstance(tools, list) else []

    @property
    def usage(self) -> dict[str, int]:
        """The rollout's tokens: the sum over its model calls of what each reported."""
        total: dict[str, int] = {}
        for call in self.model_calls:
            for key, value in (call.usage.as_dict() if call.usage else {}).items():
                total[key] = total.get(key, 0) + value
        return total

    @property
    def duration_s(self) -> float | None:
        if self.start_s is None or self.end_s is None:
            return None
        return self.end_s - self.start_s

    @property
    def model(self) -> str | None:
        return next((c.model for c in self.model_calls if c.model), None)


def _index(value: Any) -> str | None:
    """A NeMo Gym index as text: a whole number or a string (anything else is no index)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


def rollout_key(row: int, record: Any, *, failed: bool = False) -> str:
    """Which rollout of its run a line is, the same wherever it is read: ``task/T/rollout/R``
    from NeMo Gym's ``_ng_task_index`` and ``_ng_rollout_index`` (a live run sees rollouts in
    completion order, failed ones among them; ``OUT.jsonl`` and its failures sidecar hold them
    apart), prefixed ``failed/`` for a failed rollout (a rollout retried after a failure is another
    trace); without both indices its place: ``row/N`` of ``OUT.jsonl``, ``failed/N`` of the sidecar.
    Trace ids derive from it (``rollout_spans.trace_id_for``), so a live run and the post-run export
    name each rollout's trace alike."""
    placed = None
    if isinstance(record, dict):
        task, rollout = _index(record.get("_ng_task_index")), _index(record.get("_ng_rollout_index"))
        if task is not None and rollout is not None:
            placed = f"task/{task}/rollout/{rollout}"
    if failed:
        return f"failed/{placed}" if placed is not None else f"failed/{row}"
    return placed if placed is not None else f"row/{row}"


def is_failure_record(record: Any) -> bool:
    """A row of NeMo Gym's failures sidecar (``_ng_failure_class``): what a live run is also handed
    for a failed rollout with ``route_failures_to_sidecar``."""
    return isinstance(record, dict) and record.get(FAILURE_PREFIX + "class") is not None


def place(record: dict[str, Any], row: int) -> tuple[str, int | None, str]:
    """Task, repeat and agent of a rollout line (NeMo Gym's ``_ng_*`` keys first)."""
    task = record.get("_ng_task_index", record.get("task_index", row))
    repeat = record.get("_ng_rollout_index", record.get("repeat"))
    repeat = repeat if isinstance(repeat, int) and not isinstance(repeat, bool) else None
    return str(task), repeat, agent_label(record.get("agent_ref"))


def _conversation(request: Any) -> list[Any]:
    """The items a request gives the model: its ``input`` list (a string: one user message) or
    chat completions' ``messages``."""
    if not isinstance(request, dict):
        return []
    items = request.get("input", request.get("messages"))
    if isinstance(items, str):
        return [{"role": "user", "content": items, "type": "message"}]
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _is_model_item(item: dict[str, Any]) -> bool:
    return item.get("type", "message") in MODEL_ITEMS


def _steps_of_output(output: list[Any]) -> list[list[dict[str, Any]]]:
    """``output[]`` cut into runs: a model turn (its reasoning, messages and calls) or the tool
    results that follow it, in order."""
    steps: list[list[dict[str, Any]]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if steps and _is_model_item(steps[-1][0]) == _is_model_item(item):
            steps[-1].append(item)
        else:
            steps.append([item])
    return steps


def _call_id(item: dict[str, Any]) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _responses_steps(request: Any, response: dict[str, Any], observed: dict[str, ToolCall]) -> list[Step]:
    """The steps of a Response's ``output[]`` (source 2); ``observed``: tool calls NeMo Gym timed."""
    output = response.get("output") if isinstance(response.get("output"), list) else []
    runs = _steps_of_output(output)
    results = {
        _call_id(i): i.get("output") for r in runs for i in r if i.get("type") == "function_call_output"
    }
    model = _str_or_none(response.get("model"))
    usage = usage_of_response(response)
    turns = sum(1 for r in runs if _is_model_item(r[0]))
    history = _conversation(request)
    steps: list[Step] = []
    seen = 0
    for run in runs:
        if not _is_model_item(run[0]):
            history.extend(run)
            continue
        seen += 1
        last = seen == turns
        steps.append(
            ModelCall(
                inputs=list(history),
                outputs=run,
                model=model,
                usage=usage if last else None,
                usage_scope="response" if turns > 1 else "call",
                status=_str_or_none(response.get("status")) if last else None,
            )
        )
        history.extend(run)
        for call in (i for i in run if i.get("type") == "function_call"):
            call_id = _call_id(call)
            timed = observed.get(call_id)
            found = call_id in results
            steps.append(
                _tool_call(
                    call_id,
                    str(call.get("name") or "tool"),
                    call.get("arguments"),
                    results.get(call_id, timed.result if timed else None),
                    found,
                    timed,
                )
            )
    return steps


def _chat_output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completions response's first choice as Responses API items."""
    choices = response.get("choices")
    message = (
        choices[0].get("message")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict)
        else None
    )
    if not isinstance(message, dict):
        return []
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]})
    if message.get("content"):
        items.append({"type": "message", "role": "assistant", "content": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            items.append({"type": "function_call", "call_id": str(call.get("id") or ""),
                          "name": function.get("name"), "arguments": function.get("arguments")})  # fmt: skip
    return items


def _observed_tools(evidence: dict[str, Any]) -> dict[str, ToolCall]:
    """``ng_trajectory.tool_calls`` by tool call id (timing, status, output)."""
    out: dict[str, ToolCall] = {}
    for raw in evidence.get("tool_calls") or []:
        if not isinstance(raw, dict) or not raw.get("tool_call_id"):
            continue
        start, end = _timed(raw)
        out[str(raw["tool_call_id"])] = ToolCall(
            call_id=str(raw["tool_call_id"]),
            name=str(raw.get("tool_name") or "tool"),
            arguments=None,
            result=raw.get("output"),
            status=str(raw.get("status") or "unknown"),
            error=_str_or_none(raw.get("error_type")),
            start_s=start,
            end_s=end,
        )
    return out


def _model_call(raw: dict[str, Any]) -> ModelCall:
    """One ``ng_trajectory.model_calls`` entry."""
    request = raw.get("request") if isinstance(raw.get("request"), dict) else {}
    response = raw.get("response") if isinstance(raw.get("response"), dict) else {}
    meta = raw.get("response_metadata") if isinstance(raw.get("response_metadata"), dict) else {}
    stats = raw.get("token_stats") if isinstance(raw.get("token_stats"), dict) else {}
    output = response.get("output")
    outputs = (
        [i for i in output if isinstance(i, dict)]
        if isinstance(output, list)
        else _chat_output_items(response)
    )
    start, end = _timed(raw)
    usage = Usage.of(
        {"input_tokens": stats.get("prompt_tokens"), "output_tokens": stats.get("completion_tokens"),
         "total_tokens": stats.get("total_tokens"), "reasoning_tokens": stats.get("reasoning_tokens"),
         "cached_tokens": stats.get("cached_tokens")}
    )  # fmt: skip
    ttft = (
        None if isinstance(meta.get("latency_ttft_ms"), bool) else metric_value(meta.get("latency_ttft_ms"))
    )
    return ModelCall(
        inputs=_conversation(request),
        outputs=outputs,
        model=_str_or_none(meta.get("model"))
        or _str_or_none(response.get("model"))
        or _str_or_none(request.get("model")),
        usage=usage or usage_of_response(response),
        start_s=start,
        end_s=end,
        finish_reason=_str_or_none(meta.get("finish_reason")),
        error_category=_str_or_none(meta.get("error_category")),
        ttft_ms=ttft if ttft is not None and math.isfinite(ttft) and ttft >= 0 else None,
        status=_str_or_none(meta.get("response_status")),
        call_id=_str_or_none(raw.get("model_call_id")),
    )


def _evidence_steps(evidence: dict[str, Any], response: dict[str, Any]) -> list[Step] | None:
    """The steps of ``ng_trajectory`` (source 1): model calls in NeMo Gym's append order, each
    followed by the tool calls it asked for; None when it holds no model call."""
    calls = [_model_call(c) for c in evidence.get("model_calls") or [] if isinstance(c, dict)]
    if not calls:
        return None
    observed = _observed_tools(evidence)
    outputs = {
        _call_id(i): i.get("output")
        for inv in evidence.get("invocations") or [] if isinstance(inv, dict)
        for i in inv.get("conversation") or []
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }  # fmt: skip
    for item in response.get("output") or [] if isinstance(response.get("output"), list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            outputs.setdefault(_call_id(item), item.get("output"))
    steps: list[Step] = []
    placed: set[str] = set()
    for call in calls:
        steps.append(call)
        for item in call.outputs:
            if item.get("type") != "function_call" or _call_id(item) in placed:
                continue
            call_id = _call_id(item)
            placed.add(call_id)
            timed = observed.get(call_id)
            found = timed is not None or call_id in outputs
            steps.append(
                _tool_call(
                    call_id,
                    str(item.get("name") or (timed.name if timed else "tool")),
                    item.get("arguments"),
                    timed.result if timed and timed.result is not None else outputs.get(call_id),
                    found,
                    timed,
                )
            )
    for call_id, timed in observed.items():  # timed calls no model output names (kept, not lost)
        if call_id not in placed:
            steps.append(timed)
    return steps


def _timed(raw: dict[str, Any]) -> tuple[float | None, float | None]:
    """Start and end of one ``ng_trajectory`` model or tool call (end from ``duration_ms`` when
    only that is known; never before the start)."""
    start, end = seconds(raw.get("started_at")), seconds(raw.get("completed_at"))
    if end is None and start is not None and (d := _duration_s(raw.get("duration_ms"))) is not None:
        end = start + d
    return start, (end if end is None or start is None or end >= start else start)


def _latency_s(record: dict[str, Any]) -> float | None:
    perf = record.get(PERF_KEY)
    latency = _duration_s(perf.get("total_latency_ms")) if isinstance(perf, dict) else None
    if latency is None:
        number = (
            None if isinstance(record.get("latency_s"), bool | str) else metric_value(record.get("latency_s"))
        )
        latency = number if number is not None and math.isfinite(number) and 0 <= number < 1e12 else None
    return latency


def rollout_window(record: Any) -> tuple[float | None, float | None]:
    """When a rollout ran, from its line alone: the first and last time of its ``ng_trajectory``
    calls, else its Response's ``created_at`` (or the line's ``timestamp`` / ``time``) and
    ``completed_at``; the end reaches at least start + its latency (``ng_perf.total_latency_ms``,
    else ``latency_s``). ``(None, None)`` when the line holds no time; cheap (no steps built)."""
    if not isinstance(record, dict):
        return None, None
    evidence = record.get(TRAJECTORY_KEY)
    starts: list[float] = []
    ends: list[float] = []
    if isinstance(evidence, dict):
        for key in ("model_calls", "tool_calls"):
            calls = evidence.get(key)
            for raw in calls if isinstance(calls, list) else []:
                if isinstance(raw, dict):
                    start, end = _timed(raw)
                    starts.extend([start] if start is not None else [])
                    ends.extend([end] if end is not None else [])
    response = record.get(RESPONSE_KEY)
    response = response if isinstance(response, dict) else {}
    start = min(starts) if starts else None
    if start is None:
        start = (
            seconds(response.get("created_at"))
            or seconds(record.get("timestamp"))
            or seconds(record.get("time"))
        )
    if start is None:
        return None, None
    end = max(ends) if ends else seconds(response.get("completed_at"))
    latency = _latency_s(record)
    if latency is not None:
        end = max(end if end is not None else start, start + latency)
    return start, (end if end is not None and end >= start else start)


def trajectory_of(row: int, record: Any) -> Trajectory:
    """The trajectory of the line at ``row`` of ``OUT.jsonl`` (the module doc's sources)."""
    record = record if isinstance(record, dict) else {REQUEST_KEY: record}
    request = record.get(REQUEST_KEY, record.get("request"))
    response = record.get(RESPONSE_KEY)
    response = response if isinstance(response, dict) else {"output_text": response} if response else {}
    evidence = record.get(TRAJECTORY_KEY) if isinstance(record.get(TRAJECTORY_KEY), dict) else {}
    perf = record.get(PERF_KEY) if isinstance(record.get(PERF_KEY), dict) else {}
    verdicts, extra = verdicts_and_extra(
        record, (REQUEST_KEY, "request", RESPONSE_KEY, "agent_ref", *EVIDENCE_KEYS)
    )
    task, repeat, agent = place(record, row)
    steps = _evidence_steps(evidence, response) if evidence else None
    source = "ng_trajectory" if steps is not None else "responses"
    if steps is None:
        steps = _responses_steps(request, response, _observed_tools(evidence))
    start, end = rollout_window(record)
    return Trajectory(
        key=rollout_key(row, record), row=row, task=task, repeat=repeat, agent=agent, request=request,
        response=response, steps=tuple(steps), verdicts=verdicts, extra=extra, source=source, start_s=start,
        end_s=end, perf=dict(perf),
    )  # fmt: skip


def failed_trajectory(index: int, record: Any, planned: Any) -> Trajectory:
    """The trajectory of row ``index`` of ``OUT_failures.jsonl``: its failure, its planned input
    (the materialized input of the same task and repeat, when known), no steps and no times."""
    record = record if isinstance(record, dict) else {"failure": record}
    fields = {k[len(FAILURE_PREFIX) :]: v for k, v in record.items() if k.startswith(FAILURE_PREFIX)}
    failure = Failure(
        klass=str(fields.get("class") or "failure"),
        type=_str_or_none(fields.get("type")),
        message=None if fields.get("message") is None else str(fields["message"]),
        fields={k: v for k, v in fields.items() if v is not None},
    )
    task, repeat, agent = place(record, index)
    request = planned.get(REQUEST_KEY) if isinstance(planned, dict) else None
    extra = {k: v for k, v in record.items() if not k.startswith(FAILURE_PREFIX) and v is not None}
    return Trajectory(
        key=rollout_key(index, record, failed=True), row=index, task=task, repeat=repeat, agent=agent,
        request=request, response={}, steps=(), verdicts={}, extra=extra, source="planned", failure=failure,
    )  # fmt: skip


def arguments_object(arguments: Any) -> Any:
    """A tool call's arguments as an object: the JSON object a string holds, else ``{"arguments": ...}``."""
    return parsed_object(arguments, "arguments")


def parsed_object(text: Any, key: str) -> Any:
    """The JSON object ``text`` holds, else ``{key: text}`` (a dict stays as it is)."""
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            return {key: text}
        return value if isinstance(value, dict) else {key: value}
    return text if isinstance(text, dict) else {key: json_safe(text)}


def failures_with_plans(run: RunArtifacts) -> Iterator[tuple[int, Any, Any]]:
    """``(row, failure record, planned input or None)`` of each row of the run's failures sidecar:
    the planned input is the materialized input of the same task and repeat (the one lookup the
    backends and the report share; memory holds the failures and their planned inputs only)."""
    from gym_artifacts.core.jsonio import iter_jsonl

    if not run.failures_fpath.is_file():
        return
    failures = [record for _, record in iter_jsonl(run.failures_fpath, "failures JSONL")]

    def where(record: Any) -> tuple[Any, Any] | None:
        if not isinstance(record, dict):
            return None
        return record.get("_ng_task_index"), record.get("_ng_rollout_index")

    wanted = {where(r) for r in failures} - {None}
    planned: dict[Any, Any] = {}
    if wanted and run.materialized_inputs_fpath.is_file():
        for _, record in iter_jsonl(run.materialized_inputs_fpath, "materialized inputs JSONL"):
            key = where(record)
            if key in wanted and key not in planned:
                planned[key] = record
    for index, record in enumerate(failures):
        yield index, record, planned.get(where(record))


def _tool_call(call_id: str, name: str, arguments: Any, result: Any, found: bool, timed: Any) -> ToolCall:
    """A tool call with its timing from NeMo Gym's evidence when there is some, else its status
    from whether the conversation holds its output (one rule for both readings of a rollout)."""
    return ToolCall(
        call_id=call_id,
        name=name,
        arguments=arguments,
        result=result,
        status=timed.status if timed else ("completed" if found else "missing"),
        error=timed.error if timed else (None if found else "no function_call_output for this call"),
        start_s=timed.start_s if timed else None,
        end_s=timed.end_s if timed else None,
    )
