"""Rollouts seen one at a time, as the LLM-eval backends show them (pure functions, no SDK).

A NeMo Gym rollout is one JSON line: the request (``responses_create_params``), the response,
the reward and further fields. Every trace/run backend (MLflow traces, LangSmith, Phoenix,
TensorBoard's table) maps the same view, so the choice of fields and the deterministic ids live
here once. Ids are uuid5 of the run identity and the row number: a retry of the same run names
the same objects, a changed run names new ones.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_artifacts.plugin import (
    REQUEST_KEYS,
    RESPONSE_KEYS,
    RolloutTrace,
    Trajectory,
    agent_label,
    failed_trajectory,
    json_safe,
    last_user_message,
    mask_values,
    rollout_key,
    rollout_window,
    trajectory_of,
    verdicts_and_extra,
)
from gym_artifacts.plugin import response_text as api_response_text

if TYPE_CHECKING:
    from gym_artifacts.plugin import ExportPlan, RunPayload

NAMESPACE = uuid.UUID("5f0c1b7e-6d43-5b9a-9a43-6b1d2e0f8c21")


def stable_id(*parts: object) -> str:
    """A uuid5 string from the parts: the same parts always give the same id."""
    return str(uuid.uuid5(NAMESPACE, "\x1f".join(str(p) for p in parts)))


@dataclass(frozen=True)
class Rollout:
    """One rollout: where it sits (row, task, repeat, agent), what was asked and answered, and
    its numeric verdicts (``reward`` first)."""

    row: int
    task: str
    repeat: int | None
    agent: str
    request: Any
    response: Any
    verdicts: dict[str, float]
    extra: dict[str, Any]
    time: float | None
    end_time: float | None = None
    key: str = ""  # which rollout of the run (``rollout_key``): what its trace id derives from

    @property
    def reward(self) -> float | None:
        return self.verdicts.get("reward")

    def times(self, fallback_s: float) -> tuple[dt.datetime, dt.datetime]:
        """Start and end (UTC): the rollout's own (``gym_artifacts.run.trajectory.rollout_window``:
        its ``ng_trajectory`` calls, else its Response's ``created_at`` / ``completed_at`` and
        latency), else ``fallback_s`` (the run's start) plus its row in milliseconds (keeps rows
        in order) with no duration."""
        if self.time is None:
            start = dt.datetime.fromtimestamp(fallback_s + self.row / 1000, dt.timezone.utc)
            return start, start
        end_s = self.end_time if self.end_time is not None else self.time
        return (dt.datetime.fromtimestamp(self.time, dt.timezone.utc),
                dt.datetime.fromtimestamp(end_s, dt.timezone.utc))  # fmt: skip


def _first(record: dict[str, Any], keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for key in keys:
        if key in record:
            return key, record[key]
    return None, None


def rollout_from_record(row: int, record: Any) -> Rollout:
    """The view of one record; a record that is not an object is shown whole as the request."""
    if not isinstance(record, dict):
        return Rollout(row, str(row), None, "unknown", record, None, {}, {}, None, key=f"row/{row}")
    request_key, request = _first(record, REQUEST_KEYS)
    response_key, response = _first(record, RESPONSE_KEYS)
    verdicts, extra = verdicts_and_extra(record, (request_key, response_key, "agent_ref"))
    task = record.get("_ng_task_index", record.get("task_index", row))
    repeat = record.get("_ng_rollout_index", record.get("repeat"))
    when, until = rollout_window(record)
    return Rollout(
        row=row,
        task=str(task),
        repeat=repeat if isinstance(repeat, int) and not isinstance(repeat, bool) else None,
        agent=agent_label(record.get("agent_ref")),
        request=request,
        response=response,
        verdicts=verdicts,
        extra=extra,
        time=when,
        end_time=until,
        key=rollout_key(row, record),
    )


def payload_rollouts(payload: RunPayload) -> Iterator[Rollout]:
    """Every rollout the export sends (complete lines only), row numbers from 0, streamed."""
    for row, record in enumerate(payload.rollout_records()):
        yield rollout_from_record(row, record)


def response_text(response: Any) -> str:
    """The response's text as a reader wants it: the Response's ``output[]`` message text (or
    ``output_text``), see ``gym_artifacts.run.responses_api``."""
    text = api_response_text(response)
    if text:
        return text
    if isinstance(response, str):
        return response
    return "" if response is None else str(response)


def request_text(request: Any) -> str:
    """The last user message of a Responses API request, else the request as text."""
    text = last_user_message(request)
    if text:
        return text
    return "" if request is None else str(request)


def as_object(value: Any, key: str) -> dict[str, Any]:
    """Trace platforms want objects for inputs and outputs: a dict as is, else ``{key: value}``."""
    return value if isinstance(value, dict) else {key: value}


def masked(value: Any, secrets: frozenset[str]) -> Any:
    """JSON-safe ``value`` with every known secret and secret shape masked in its decoded strings
    and keys (never in escaped JSON text, where ``é`` or a quote no longer matches)."""
    value = json_safe(value)
    if not secrets:
        return value
    return mask_values(value, secrets)


PROGRESS_EVERY = 100  # traces between two progress reports


def payload_traces(
    payload: RunPayload, scope: str, fallback_s: float, plan: ExportPlan | None = None
) -> Iterator[RolloutTrace]:
    """Every rollout of the export as a trace (``gym_artifacts.run.rollout_spans``): the scored rows
    of ``OUT.jsonl`` in file order, then each row of ``OUT_failures.jsonl`` as an ERROR trace
    with its planned input; streamed (memory holds the failures' planned inputs only).

    ``plan``: the backend's plan, told how many traces were handed to the backend so far
    (``ExportPlan.traces_sent``, every ``PROGRESS_EVERY`` and at the end) for the progress line."""
    from gym_artifacts.plugin import failure_trace, rollout_trace

    secrets = payload.secrets
    total = trace_total(payload) if plan is not None and plan.on_traces_sent is not None else None
    handed = 0

    def handed_one() -> None:
        nonlocal handed
        handed += 1
        if total is not None and plan is not None and handed % PROGRESS_EVERY == 0:
            plan.traces_sent(handed, max(total, handed))

    earliest = fallback_s
    for row, record in enumerate(payload.rollout_records()):
        trace = rollout_trace(scope, row, record, fallback_s, secrets)
        earliest = min(earliest, trace.start_ns / 1e9)
        yield trace
        handed_one()
    # a failure has no time of its own: the eval's start, or the first rollout's if earlier (the
    # run's files may be younger than the eval: a copy, a download)
    for index, record, planned in failed_rollouts(payload):
        yield failure_trace(scope, index, record, planned, earliest, secrets)
        handed_one()
    if total is not None and plan is not None:
        plan.traces_sent(handed, max(total, handed))


def trace_total(payload: RunPayload) -> int:
    """How many traces ``payload_traces`` yields: the rollouts and the failures sidecar's rows."""
    from gym_artifacts.plugin import count_lines

    if not payload.sends_rollouts:
        return 0
    failures = payload.run.failures_fpath
    try:  # for the progress line only: an unreadable sidecar is the send's to report, not this
        return payload.rollout_rows + (count_lines(failures) if failures.is_file() else 0)
    except OSError:
        return payload.rollout_rows


def failed_rollouts(payload: RunPayload) -> Iterator[tuple[int, Any, Any]]:
    """``(row, failure record, planned input or None)`` of each row of the failures sidecar, when
    rollouts are sent (``failures_with_plans``)."""
    from gym_artifacts.plugin import failures_with_plans

    if not payload.sends_rollouts:
        return
    yield from failures_with_plans(payload.run)


# -- the readable rollouts table (W&B, TensorBoard): what a person reads in one rollout -----------------
READABLE_COLUMNS = ["task", "repeat", "agent", "prompt", "answer", "tool_calls", "input_tokens",
                    "output_tokens", "total_tokens", "reward", "failed", "failure"]  # fmt: skip
TEXT_CHARS = 2000  # of a prompt, an answer or the tool calls in one cell


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def tool_calls_text(trajectory: Trajectory) -> str:
    """``name(arguments) -> status`` of each tool call, in order."""
    calls = []
    for call in trajectory.tool_calls:
        arguments = call.arguments
        arguments = arguments if isinstance(arguments, str) else json.dumps(json_safe(arguments))
        calls.append(f"{call.name}({arguments}) -> {call.status}")
    return "; ".join(calls)


def readable_row(trajectory: Trajectory, secrets: frozenset[str] = frozenset()) -> list[Any]:
    """One rollout as ``READABLE_COLUMNS``: texts masked and cut, tokens summed over its model
    calls, ``reward`` None for a failed rollout (never a zero)."""
    usage = trajectory.usage
    texts = [_cut(trajectory.prompt), _cut(trajectory.answer) if not trajectory.failed else "",
             _cut(tool_calls_text(trajectory))]  # fmt: skip
    if secrets:
        texts = [str(masked(t, secrets)) for t in texts]
    failure = trajectory.failure.text if trajectory.failure is not None else None
    return [
        int(trajectory.task) if trajectory.task.isdigit() else trajectory.task,
        trajectory.repeat, trajectory.agent, *texts,
        usage.get("input_tokens"), usage.get("output_tokens"), usage.get("total_tokens"),
        trajectory.reward, trajectory.failed,
        masked(_cut(failure), secrets) if failure is not None else None,
    ]  # fmt: skip


def is_responses_record(record: Any) -> bool:
    """A NeMo Gym (Responses API) rollout line, or a row of its failures sidecar."""
    return isinstance(record, dict) and (
        "responses_create_params" in record or "response" in record or "_ng_failure_class" in record
    )


def table_rows(records: Iterator[Any]) -> Iterator[Any]:
    """The rows of a rollouts table: each NeMo Gym rollout as its ``Trajectory`` (read by
    ``readable_row``), when the first record is one; other writers' records as they are."""
    first = next(records, None)
    if first is None:
        return
    if not is_responses_record(first):
        yield first
        yield from records
        return
    yield trajectory_of(0, first)
    for row, record in enumerate(records, start=1):
        yield trajectory_of(row, record)


def payload_table_rows(payload: RunPayload) -> Iterator[Any]:
    """``table_rows`` of the export's rollouts, then (NeMo Gym runs) each failed rollout with its
    planned input: every planned rollout with a result, streamed."""
    responses = False
    for row in table_rows(payload.rollout_records()):
        responses = responses or isinstance(row, Trajectory)
        yield row
    if responses:
        for index, record, planned in failed_rollouts(payload):
            yield failed_trajectory(index, record, planned)

