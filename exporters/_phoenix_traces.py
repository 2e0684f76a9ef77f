"""Rollouts as Phoenix traces: OTLP/HTTP with OpenInference attributes, verdicts as span
annotations in batches, exactly once.

Each rollout is the span tree of ``gym_artifacts.run.rollout_spans`` (root ``AGENT``, ``LLM`` per
model turn with its messages and token counts, ``TOOL`` per function call; a failed rollout an
ERROR root span with its message), named in OpenInference's conventions
(``openinference-semantic-conventions``): ``openinference.span.kind``, ``input.value`` /
``output.value`` (JSON), ``llm.input_messages.N.message.*``, ``llm.output_messages.N.*`` with
tool calls, ``llm.token_count.*``, ``llm.model_name``, ``tool.name``, ``metadata``, ``tag.tags``.
Spans go to Phoenix's OTLP collector (``POST /v1/traces``, header ``x-project-name``) a batch at a
time; every verdict becomes a ``CODE`` **trace** annotation (Phoenix's "trace annotation scores"),
through the client's batch call (``log_trace_annotations``, one request per batch). The root
span's input and output are what a person reads in Phoenix's trace list (the last user turn, the
final answer, as text); the request and Response stay whole in the root's ``metadata`` and the
children. A model call lists the tools offered (``llm.tools.N.tool.json_schema``), and every span
carries OpenTelemetry's ``gen_ai.*`` attributes.

Exactly once: trace and span ids are derived from the project, the run's identity and the
rollout; Phoenix keeps the first span of an id (``ON CONFLICT DO NOTHING``) and upserts an
annotation by (trace, name, identifier). Phoenix stores spans in the background, so the export
reads back every root span before it counts as done (a missing one fails the export: no receipt,
and the rerun sends the same ids).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gym_artifacts.plugin import LLM, TOOL, GymArtifactsError, RolloutTrace, Span, made_progress

from ._genai import chat_tools, gen_ai_attributes
from ._otlp import export_request, trace_batches

BATCH = 500  # traces an OTLP request and annotations a request
CHECK = 100  # root span ids a read-back request
SOURCE = "gym-artifacts"


class NotLanded(GymArtifactsError):
    """Phoenix did not store every span it was sent within the wait."""


@dataclass
class PhoenixTracesSent:
    """What one export sent to Phoenix as traces: the traces, and the failed rollouts among them
    (not the contract's ``Sent``, which the backend returns for the whole export)."""

    traces: int = 0
    failed: int = 0


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages(prefix: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    from openinference.semconv.trace import MessageAttributes as M
    from openinference.semconv.trace import ToolCallAttributes as T

    out: dict[str, Any] = {}
    for i, message in enumerate(messages):
        at = f"{prefix}.{i}."
        out[at + M.MESSAGE_ROLE] = message.get("role", "")
        if message.get("content"):
            out[at + M.MESSAGE_CONTENT] = message["content"]
        if message.get("reasoning"):
            out[at + M.MESSAGE_CONTENT] = message["reasoning"]
        if message.get("tool_call_id"):
            out[at + M.MESSAGE_TOOL_CALL_ID] = message["tool_call_id"]
        for j, call in enumerate(message.get("tool_calls", [])):
            call_at = f"{at}{M.MESSAGE_TOOL_CALLS}.{j}."
            out[call_at + T.TOOL_CALL_ID] = call["id"]
            out[call_at + T.TOOL_CALL_FUNCTION_NAME] = call["name"]
            out[call_at + T.TOOL_CALL_FUNCTION_ARGUMENTS_JSON] = call["arguments"]
    return out


def span_attributes(trace: RolloutTrace, span: Span) -> dict[str, Any]:
    """OpenInference attributes of one span (flat keys, primitive values)."""
    from openinference.semconv.trace import SpanAttributes as S

    attributes: dict[str, Any] = {S.OPENINFERENCE_SPAN_KIND: span.kind, **gen_ai_attributes(trace, span)}
    root = span.parent_id is None
    if root and trace.request_preview:  # the trace list's input column: the last user turn
        attributes[S.INPUT_VALUE] = trace.request_preview
        attributes[S.INPUT_MIME_TYPE] = "text/plain"
    elif span.inputs is not None:
        attributes[S.INPUT_VALUE] = _json(span.inputs)
        attributes[S.INPUT_MIME_TYPE] = "application/json"
    if root and trace.response_preview:  # its output column: the final answer (or the failure)
        attributes[S.OUTPUT_VALUE] = trace.response_preview
        attributes[S.OUTPUT_MIME_TYPE] = "text/plain"
    elif span.outputs is not None:
        attributes[S.OUTPUT_VALUE] = _json(span.outputs)
        attributes[S.OUTPUT_MIME_TYPE] = "application/json"
    if span.kind == LLM:
        attributes.update(_messages(S.LLM_INPUT_MESSAGES, span.input_messages))
        attributes.update(_messages(S.LLM_OUTPUT_MESSAGES, span.output_messages))
        if span.model:
            attributes[S.LLM_MODEL_NAME] = span.model
        if span.usage:
            attributes[S.LLM_TOKEN_COUNT_PROMPT] = span.usage.get("input_tokens")
            attributes[S.LLM_TOKEN_COUNT_COMPLETION] = span.usage.get("output_tokens")
            attributes[S.LLM_TOKEN_COUNT_TOTAL] = span.usage.get("total_tokens")
            if "cached_tokens" in span.usage:
                attributes[S.LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ] = span.usage["cached_tokens"]
            if "reasoning_tokens" in span.usage:
                attributes[S.LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING] = span.usage["reasoning_tokens"]
        for i, tool in enumerate(chat_tools(span.tools)):
            attributes[f"{S.LLM_TOOLS}.{i}.tool.json_schema"] = _json(tool)
    if span.kind == TOOL:
        attributes[S.TOOL_NAME] = span.name
    metadata = dict(span.attributes)
    if root:  # the whole request and Response, beside the readable input and output
        metadata.update({"request": span.inputs, "response": span.outputs})
    if metadata:
        attributes[S.METADATA] = _json(metadata)
    if span.parent_id is None:
        attributes[S.TAG_TAGS] = [f"{k}:{v}" for k, v in trace.tags.items()]
    return attributes


def _annotations(batch: list[RolloutTrace]) -> list[dict[str, Any]]:
    return [
        {"trace_id": t.trace_id, "name": name, "annotator_kind": "CODE", "identifier": SOURCE,
         "result": {"score": score}, "metadata": {"source": SOURCE}}
        for t in batch for name, score in t.feedback.items()
    ]  # fmt: skip


def send_traces(
    client: Any, project: str, traces: Iterable[RolloutTrace], timeout: float, wait_s: float
) -> PhoenixTracesSent:
    """Send the traces and their annotations to the Phoenix behind ``client`` (a
    ``phoenix.client.Client``), then read every root span back; returns what was sent."""
    sent = PhoenixTracesSent()
    headers = {"Content-Type": "application/x-protobuf", "x-project-name": project}
    resource = {"openinference.project.name": project, "service.name": SOURCE}
    previous: list[RolloutTrace] = []
    previous_deadline = 0.0
    # one batch behind: while Phoenix stores batch k in the background, batch k-1 is read back
    # and annotated (synchronously: an annotation needs its span stored). Each batch may take
    # ``wait_s`` from when it was posted to be stored; once stored and annotated it counts as the
    # export's progress (its ``export_deadline`` restarts), so a large export is bounded per
    # batch, not in total.
    for batch in trace_batches(traces, BATCH):
        body = export_request(batch, span_attributes, resource)
        response = client._client.post("v1/traces", content=body, headers=headers, timeout=timeout)
        response.raise_for_status()
        _landed_then_annotate(client, project, previous, timeout, previous_deadline)
        previous, previous_deadline = batch, time.monotonic() + wait_s
        sent.traces += len(batch)
        sent.failed += sum(1 for t in batch if t.failed)
    _landed_then_annotate(client, project, previous, timeout, previous_deadline)
    return sent


def only_missing(
    client: Any, project: str, traces: Iterable[RolloutTrace], timeout: float
) -> Iterator[RolloutTrace]:
    """The traces of ``traces`` whose root span ``project`` lacks (streamed, ``CHECK`` root span
    ids a request): a live run sent the others with the same ids. Their annotations are logged
    again (upserts: a live run killed between a batch's spans and its annotations loses none)."""
    for batch in trace_batches(traces, CHECK):
        present = _stored(client, project, [t.root.span_id for t in batch], timeout)
        there = [t for t in batch if t.root.span_id in present]
        annotations = _annotations(there)
        if annotations:
            client.traces.log_trace_annotations(trace_annotations=annotations, sync=True)
        yield from (t for t in batch if t.root.span_id not in present)


def _stored(client: Any, project: str, span_ids: list[str], timeout: float) -> set[str]:
    """Which of ``span_ids`` the project holds (none while the project does not exist)."""
    import httpx

    try:
        found = client.spans.get_spans(project_identifier=project, span_ids=span_ids, limit=len(span_ids),
                                       timeout=int(timeout))  # fmt: skip
    except httpx.HTTPStatusError as exc:  # the project appears with its first stored span
        if exc.response.status_code != 404:
            raise
        return set()
    return {str(span["context"]["span_id"]) for span in found}


def _landed_then_annotate(
    client: Any, project: str, batch: list[RolloutTrace], timeout: float, deadline: float
) -> None:
    if not batch:
        return
    _wait_landed(client, project, [t.root.span_id for t in batch], timeout, deadline)
    annotations = _annotations(batch)
    if annotations:
        client.traces.log_trace_annotations(trace_annotations=annotations, sync=True)
    made_progress()


def _wait_landed(client: Any, project: str, span_ids: list[str], timeout: float, deadline: float) -> None:
    """Every span id is in the project (Phoenix inserts in the background), or NotLanded once
    ``deadline`` (monotonic) passes."""
    for start in range(0, len(span_ids), CHECK):
        chunk = span_ids[start : start + CHECK]
        while True:
            found = _stored(client, project, chunk, timeout)
            if len(found) >= len(chunk):
                break
            if time.monotonic() > deadline:
                raise NotLanded(f"Phoenix stored {len(found)} of {len(chunk)} spans in the time allowed")
            time.sleep(0.5)
