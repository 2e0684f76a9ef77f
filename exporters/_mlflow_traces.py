"""Rollouts as MLflow traces through MLflow's public ingestion paths, exactly once.

Each rollout is a span tree (``gym_artifacts.run.rollout_spans``): the root ``AGENT`` span, an
``LLM`` span per model turn (``mlflow.chat.tokenUsage``, ``mlflow.llm.model``) and a ``TOOL``
span per function call; a failed rollout is an ERROR trace with its failure message. Per trace,
one ``start_trace`` (MLflow's REST ``POST /api/3.0/mlflow/traces``) carries what only the trace
holds: its times (the rollout's own), state, previews, tags (task, repeat, agent, row), the run
in its metadata (``mlflow.sourceRun``) and every verdict as a ``CODE`` feedback assessment (MLflow
has no batch call for assessments). Then the spans of a whole batch go in one OTLP/HTTP request
to ``/v1/traces`` (header ``x-mlflow-experiment-id``), and the batch is linked to the run (100
trace ids a request).

Exactly once: trace ids are derived from the MLflow run (itself found by the run's content
identity on a rerun) and the rollout; span and assessment ids from the trace. A rerun after a kill
sends the same ids: the server merges a known trace's info in place and upserts its spans.

A database store (``sqlite:///``, ``postgresql://``...) has no ``/v1/traces`` of its own: the
export starts MLflow's own server on that store for its duration (``mlflow server`` on
127.0.0.1, killed with its process group at the end) and sends the same requests there, so no
MLflow table is ever written by this project.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_artifacts.plugin import LLM, RolloutTrace, Span

from ._genai import chat_tools, gen_ai_attributes, token_usage
from ._mlflow_trace_view import TraceWindow
from ._otlp import export_request, trace_batches

if TYPE_CHECKING:
    from ._mlflow_client import ScopedMlflow

logger = logging.getLogger(__name__)

BATCH = 200  # traces an OTLP request
WORKERS = 4  # start_trace requests in flight at once
LINKS = 100  # MLflow's most trace ids a link_traces_to_run request
PREVIEW_CHARS = 1000
SOURCE_ID = "gym-artifacts"
TAG_PREFIX = "gym_artifacts."
ROW_TAG = "gym_artifacts.row"
RESOURCE = {"service.name": "gym-artifacts"}


@dataclass
class MlflowTracesSent:
    """What one export traced: every trace, the ERROR ones among them, and the first and last
    trace's start (epoch ms; None before any)."""

    traces: int = 0
    failed: int = 0
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, batch: list[RolloutTrace]) -> None:
        starts = [t.start_ns // 1_000_000 for t in batch]
        self.traces += len(batch)
        self.failed += sum(1 for t in batch if t.failed)
        if starts:
            self.first_ms = min(starts) if self.first_ms is None else min(self.first_ms, *starts)
            self.last_ms = max(starts) if self.last_ms is None else max(self.last_ms, *starts)

    @property
    def window(self) -> TraceWindow | None:
        """Where MLflow's UI shows these traces (None when there are none)."""
        if self.first_ms is None or self.last_ms is None:
            return None
        return TraceWindow(self.traces, self.first_ms, self.last_ms)


def mlflow_trace_id(trace: RolloutTrace) -> str:
    """MLflow's id of an OTLP trace: ``tr-`` and the 32 hex digits."""
    return "tr-" + trace.trace_id


SPAN_TYPES = {LLM: "CHAT_MODEL"}  # a model call takes and gives chat messages: MLflow's CHAT_MODEL


def span_attributes(trace: RolloutTrace, span: Span) -> dict[str, Any]:
    """MLflow's attributes of one span: its type (``AGENT``, ``CHAT_MODEL``, ``TOOL``), inputs and
    outputs, token usage, model, the tools offered in MLflow's (chat-completions) tool format, the
    OpenTelemetry ``gen_ai.*`` attributes; the span model's own attributes under ``gym.``."""
    attributes: dict[str, Any] = {
        "mlflow.spanType": SPAN_TYPES.get(span.kind, span.kind),
        "mlflow.spanInputs": span.inputs,
        "mlflow.spanOutputs": span.outputs,
    }
    usage = token_usage(span) if span.kind == LLM else {}  # MLflow sums the spans' into the trace's
    if usage:
        attributes["mlflow.chat.tokenUsage"] = usage
    if span.model:
        attributes["mlflow.llm.model"] = span.model
    tools = chat_tools(span.tools) if span.kind == LLM else []
    if tools:
        attributes["mlflow.chat.tools"] = tools
    attributes.update(gen_ai_attributes(trace, span))
    for key, value in span.attributes.items():
        attributes[f"gym.{key}"] = value
    for key in ("reasoning_tokens", "cached_tokens"):
        if span.usage and key in span.usage:
            attributes[f"gym.{key}"] = span.usage[key]
    if span.parent_id is None:  # the trace's tags, for a trace that gets no start_trace
        attributes["mlflow.traceTag.mlflow.traceName"] = trace.name
        for key, value in trace.tags.items():
            attributes[f"mlflow.traceTag.{TAG_PREFIX}{key}"] = value
        for key, value in trace.feedback.items():
            attributes[f"mlflow.traceTag.{TAG_PREFIX}{key}"] = f"{value:g}"
    return attributes


def trace_info(trace: RolloutTrace, experiment_id: str, run_id: str) -> Any:
    """The TraceInfo ``start_trace`` sends: times, state, previews, tags, run, feedback."""
    from mlflow.entities import AssessmentSource, Feedback, TraceInfo, TraceLocation, TraceState

    trace_id = mlflow_trace_id(trace)
    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    assessments = []
    for name, value in trace.feedback.items():
        feedback = Feedback(name=name, value=value, source=source, trace_id=trace_id)
        feedback.assessment_id = "a-" + hashlib.sha256(f"{trace_id}/{name}".encode()).hexdigest()[:32]
        assessments.append(feedback)
    start_ms = trace.start_ns // 1_000_000
    return TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ms,
        execution_duration=trace.end_ns // 1_000_000 - start_ms,
        state=TraceState.ERROR if trace.failed else TraceState.OK,
        request_preview=trace.request_preview[:PREVIEW_CHARS],
        response_preview=trace.response_preview[:PREVIEW_CHARS],
        trace_metadata={"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3"},
        tags={"mlflow.traceName": trace.name, **{TAG_PREFIX + k: v for k, v in trace.tags.items()}},
        assessments=assessments,
    )


def _landed(info: Any) -> bool:
    """A trace MLflow holds whole: its spans stored (``start_trace`` alone makes a trace's info
    without spans: an export killed between the two requests)."""
    return SPANS_TAG in (info.tags or {})


SPANS_TAG = "mlflow.trace.spansLocation"  # set by the server once it stored a trace's spans


def only_missing(ml: ScopedMlflow, traces: Iterable[RolloutTrace]) -> Iterator[RolloutTrace]:
    """The traces of ``traces`` that the server behind ``ml`` does not hold whole (streamed, a
    lookup of ``LINKS`` trace ids a request): a live run sent the rest with the same ids."""
    store = ml.client._tracking_client.store
    for batch in trace_batches(traces, LINKS):
        found = store.batch_get_trace_infos([mlflow_trace_id(t) for t in batch])
        landed = {info.trace_id for info in found if _landed(info)}
        yield from (t for t in batch if mlflow_trace_id(t) not in landed)


def batch_requests(
    traces: Iterable[RolloutTrace],
    experiment_id: str,
    run_id: str,
    *,
    infos: bool = True,
    batch: int | None = None,
) -> Iterator[tuple[list[RolloutTrace], list[Any], bytes]]:
    """Each batch of ``traces`` as the export sends it: the traces, their MLflow trace infos
    (``start_trace``; none when ``infos`` is False) and the OTLP request body of their spans.
    ``batch``: traces a request (None: ``BATCH``, read when called)."""
    for chunk in trace_batches(traces, batch or BATCH):
        trace_infos = [trace_info(t, experiment_id, run_id) for t in chunk] if infos else []
        yield chunk, trace_infos, export_request(chunk, span_attributes, RESOURCE)


def log_rollout_traces(
    ml: ScopedMlflow,
    experiment_id: str,
    run_id: str,
    traces: Iterable[RolloutTrace],
    assessments: bool = True,
) -> MlflowTracesSent:
    """Send every trace to the ``mlflow server`` behind ``ml`` (a trace already there is
    rewritten in place, never doubled). Memory is bounded by the batch, not the rows.

    ``assessments=False`` leaves out the per-trace ``start_trace``: the spans alone make the trace
    (its times from them, its state from the root span, its tags from the root's
    ``mlflow.traceTag.*`` attributes, verdicts among them as text), about 6x cheaper a trace."""
    store = ml.client._tracking_client.store  # the scoped REST client of MLflow's public REST API
    sent = MlflowTracesSent()
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="gym-artifacts-mlflow-trace") as pool:
        for batch, infos, request in batch_requests(traces, experiment_id, run_id, infos=assessments):
            list(pool.map(store.start_trace, infos))
            ml.post_otlp(experiment_id, request)
            ids = [mlflow_trace_id(t) for t in batch]
            for start in range(0, len(ids), LINKS):
                ml.client.link_traces_to_run(ids[start : start + LINKS], run_id)
            sent.add(batch)
            ml.progress()  # the deadline bounds a stalled server, not the number of batches
    return sent
