"""Rollouts as MLflow traces with their verdicts as feedback, exactly once (SDK imported lazily).

Each rollout becomes one trace in the run's experiment: a single ``AGENT`` span whose inputs are
the request (NeMo Gym's ``responses_create_params``) and outputs the response, the rollout's
other fields as span attributes, its place (row, task, repeat, agent) as trace tags, and every
numeric verdict (``reward`` first) as a ``CODE`` feedback assessment. The trace carries the run
in its metadata (``mlflow.sourceRun``) and is linked to it.

Exactly once: the trace id is uuid5(MLflow run id, row) and each assessment id uuid5(trace id,
verdict name). MLflow's ``start_trace`` of an id it already holds updates that trace in place
(its tags and assessments are merged by key), so a re-export or a retry after a crash rewrites
the same traces instead of adding new ones. Requests go through the exporter's scoped store
(its token, timeouts and retries): one ``start_trace`` per rollout, spans and run links 100 at a
time.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable
from typing import Any

from gym_artifacts.jsonio import json_safe
from gym_artifacts.secrets import redact_text

from ._rollouts import Rollout, request_text, response_text

BATCH = 100
PREVIEW_CHARS = 1000
SOURCE_ID = "gym-artifacts"
ROW_TAG = "gym_artifacts.row"


def trace_uuid(run_id: str, row: int) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"gym-artifacts/mlflow/{run_id}/{row}")


def _text(value: Any, secrets: frozenset[str]) -> str:
    text = json.dumps(json_safe(value), ensure_ascii=False, default=str)
    return redact_text(text, secrets) if secrets else text


def build_trace(
    r: Rollout, experiment_id: str, run_id: str, fallback_ms: int, secrets: frozenset[str]
) -> tuple[Any, Any]:
    """The TraceInfo (with its assessments) and the root span of one rollout."""
    from mlflow.entities import AssessmentSource, Feedback, TraceInfo, TraceLocation, TraceState
    from mlflow.entities.span import Span

    tid_uuid = trace_uuid(run_id, r.row)
    trace_id = "tr-" + tid_uuid.hex
    start, end = r.times(fallback_ms / 1000)
    start_ms = int(start.timestamp() * 1000)
    duration_ms = int((end - start).total_seconds() * 1000)
    inputs, outputs = _text(r.request, secrets), _text(r.response, secrets)
    attributes = {
        "mlflow.traceRequestId": json.dumps(trace_id),
        "mlflow.spanType": json.dumps("AGENT"),
        "mlflow.experimentId": json.dumps(experiment_id),
        "mlflow.spanInputs": inputs,
        "mlflow.spanOutputs": outputs,
    }
    for key, value in {**r.extra, **r.verdicts}.items():
        attributes[f"gym.{key}"] = _text(value, secrets)
    span = Span.from_dict(
        {
            "trace_id": base64.b64encode(tid_uuid.bytes).decode(),
            "span_id": base64.b64encode(tid_uuid.bytes[:8]).decode(),
            "parent_span_id": None,
            "name": "rollout",
            "start_time_unix_nano": start_ms * 1_000_000,
            "end_time_unix_nano": (start_ms + duration_ms) * 1_000_000,
            "events": [],
            "status": {"code": "STATUS_CODE_OK", "message": ""},
            "attributes": attributes,
            "links": [],
        }
    )
    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    assessments = []
    for name, value in r.verdicts.items():
        feedback = Feedback(name=name, value=value, source=source, trace_id=trace_id)
        feedback.assessment_id = "a-" + uuid.uuid5(tid_uuid, name).hex
        assessments.append(feedback)
    tags = {
        "mlflow.traceName": "rollout",
        ROW_TAG: str(r.row),
        "gym_artifacts.task": r.task[:250],
        "gym_artifacts.agent": r.agent[:250],
    }
    if r.repeat is not None:
        tags["gym_artifacts.repeat"] = str(r.repeat)
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ms,
        execution_duration=duration_ms,
        state=TraceState.OK,
        request_preview=redact_text(request_text(r.request), secrets)[:PREVIEW_CHARS],
        response_preview=redact_text(response_text(r.response), secrets)[:PREVIEW_CHARS],
        trace_metadata={"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3"},
        tags=tags,
        assessments=assessments,
    )
    return info, span


def log_rollout_traces(
    store: Any,
    experiment_id: str,
    run_id: str,
    rollouts: Iterable[Rollout],
    fallback_ms: int,
    secrets: frozenset[str] = frozenset(),
) -> int:
    """Write (or rewrite in place) one trace per rollout; returns how many. Constant memory."""
    count = 0
    batch: list[tuple[Any, Any]] = []

    def flush() -> None:
        for info, _ in batch:
            store.start_trace(info)
        store.log_spans(experiment_id, [span for _, span in batch])
        store.link_traces_to_run([info.trace_id for info, _ in batch], run_id)
        batch.clear()

    for r in rollouts:
        batch.append(build_trace(r, experiment_id, run_id, fallback_ms, secrets))
        count += 1
        if len(batch) == BATCH:
            flush()
    if batch:
        flush()
    return count
