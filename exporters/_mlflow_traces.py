"""Rollouts as MLflow traces with their verdicts as feedback, exactly once (SDK imported lazily).

Each rollout becomes one trace in the run's experiment: a single ``AGENT`` span whose inputs are
the request (NeMo Gym's ``responses_create_params``) and outputs the response, the rollout's
other fields as span attributes, its place (row, task, repeat, agent) as trace tags, and every
numeric verdict (``reward`` first) as a ``CODE`` feedback assessment. The trace carries the run
in its metadata (``mlflow.sourceRun``) and is linked to it.

Exactly once: the trace id is uuid5(MLflow run id, row) and each assessment id uuid5(trace id,
verdict name).

Two ways in, the same rows out:
- a database store (``sqlite:///``, ``postgresql://``...) of a tested MLflow release
  (``BATCHED_RELEASES``; others take the server's way below): ``BATCH`` traces a transaction. Each
  trace's info, tags, metadata, assessments and span are inserted as MLflow's own ``start_trace``
  then ``log_spans`` leave them (tests/test_mlflow_traces.py compares the two row for row), but
  one transaction holds the whole batch; then ``link_traces_to_run`` (idempotent). A trace id
  already in the store was committed whole by an earlier (killed) export of the same run, so it
  is left alone. MLflow's own calls cost a transaction, an experiment lookup and per-trace
  queries per rollout (about 35 ms on this project's 2 cores, 98 ms under load); the batch is
  what makes 100,000 rollouts measurable (BENCHMARKS.md).
- an ``mlflow server``: one ``start_trace`` request per rollout, which the server applies to a
  trace it already holds in place (tags and assessments merged by key); spans and run links
  100 at a time. Requests go through the exporter's scoped store (its token, timeouts, retries).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable
from typing import Any

from gym_artifacts.plugin import json_safe, redact_text

from ._rollouts import Rollout, request_text, response_text

BATCH = 500  # traces a transaction (database stores)
# MLflow releases whose trace tables the batch writes (tests/test_mlflow_traces.py compares its
# rows with MLflow's own start_trace + log_spans): the batch uses MLflow's private helpers.
BATCHED_RELEASES = ("3.17.",)
LINKS = 100  # MLflow's most trace ids a link_traces_to_run request
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


def _sql_rows(store: Any, experiment: Any, info: Any, span: Any) -> dict[str, list[dict[str, Any]]]:
    """The rows, by table, that MLflow's ``start_trace(info)`` then ``log_spans([span])`` leave
    for a trace with one finished root span (mlflow/store/tracking/sqlalchemy_store.py:
    ``_start_trace_once``'s insert path; ``log_spans``' span row, its model and cost columns,
    the trace's token and cost totals, the spans-location tag and the payload-generation bump).
    Our spans carry no session or user attribute, the only other thing ``log_spans`` derives."""
    from mlflow.store.db.db_types import MSSQL
    from mlflow.store.tracking.dbmodels.models import SqlAssessments
    from mlflow.store.tracking.sqlalchemy_store import _span_aggregation_node, _try_parse_json_string
    from mlflow.store.tracking.utils.trace_analytics import (
        COST_COLUMN_BY_KEY,
        PROMOTED_TRACE_METADATA_KEYS,
        TOKEN_COLUMN_BY_KEY,
        analytics_columns_from_metadata,
        bounded_model_dimension,
        finite_float_or_none,
        token_count_or_none,
        validate_trace_name,
    )
    from mlflow.tracing.constant import SpanAttributeKey, SpansLocation, TraceMetadataKey, TraceTagKey
    from mlflow.tracing.otel.translation import translate_span_when_storing
    from mlflow.tracing.utils import (
        TraceJSONEncoder,
        aggregate_cost_from_span_nodes,
        aggregate_usage_from_span_nodes,
    )

    trace_id = info.trace_id
    metadata = dict(info.trace_metadata.items())
    trace_info = {
        "request_id": trace_id,
        "experiment_id": int(info.experiment_id),
        "timestamp_ms": info.request_time,
        "execution_time_ms": info.execution_duration,
        "status": info.state.value,
        "client_request_id": info.client_request_id,
        "request_preview": info.request_preview,
        "response_preview": info.response_preview,
        "trace_name": validate_trace_name(info.tags.get(TraceTagKey.TRACE_NAME)),
        "db_payload_generation": 1,
        **analytics_columns_from_metadata(metadata),
    }
    span_dict = translate_span_when_storing(span)
    attributes = span_dict.get("attributes", {})
    totals_by = (
        (
            SpanAttributeKey.CHAT_USAGE,
            TOKEN_COLUMN_BY_KEY,
            aggregate_usage_from_span_nodes,
            token_count_or_none,
        ),
        (SpanAttributeKey.LLM_COST, COST_COLUMN_BY_KEY, aggregate_cost_from_span_nodes, finite_float_or_none),
    )
    for key, columns, aggregate, number in totals_by:
        if any(trace_info.get(column) is not None for column in columns.values()):
            continue  # start_trace's own figures are authoritative
        totals = aggregate([_span_aggregation_node(span.span_id, span.parent_id, attributes, key)]) or {}
        for name, column in columns.items():
            if (value := number(totals.get(name))) is not None:
                trace_info[column] = value
    cost: dict[str, Any] = {}
    if raw_cost := attributes.get(SpanAttributeKey.LLM_COST):
        try:
            cost = json.loads(raw_cost)
        except (TypeError, ValueError):
            cost = {}
    span_row = {
        "trace_id": span.trace_id,
        "experiment_id": int(info.experiment_id),
        "span_id": span.span_id,
        "parent_span_id": span.parent_id,
        "name": span.name,
        "type": span.span_type,
        "status": span.status.status_code,
        "start_time_unix_nano": span.start_time_ns,
        "end_time_unix_nano": span.end_time_ns,
        "content": json.dumps(span_dict, cls=TraceJSONEncoder, ensure_ascii=store.db_type == MSSQL),
        "input_cost": finite_float_or_none(cost.get("input_cost")),
        "output_cost": finite_float_or_none(cost.get("output_cost")),
        "total_cost": finite_float_or_none(cost.get("total_cost")),
        "model_name": bounded_model_dimension(_try_parse_json_string(attributes.get(SpanAttributeKey.MODEL))),
        "model_provider": bounded_model_dimension(
            _try_parse_json_string(attributes.get(SpanAttributeKey.MODEL_PROVIDER))
        ),
    }
    location = store._get_trace_artifact_location_tag(experiment, trace_id)
    tags = {k: v for k, v in info.tags.items() if k != TraceTagKey.TRACE_NAME}
    tags[location.key] = location.value
    tags[TraceTagKey.SPANS_LOCATION] = SpansLocation.TRACKING_STORE.value
    for key in PROMOTED_TRACE_METADATA_KEYS:
        metadata.pop(key, None)
    metadata[TraceMetadataKey.TRACE_INFO_FINALIZED] = "true"
    assessments = []
    columns = SqlAssessments.__table__.columns.keys()
    for a in info.assessments:
        row = SqlAssessments.from_mlflow_entity(a)
        row.trace_id = trace_id
        row.experiment_id = int(info.experiment_id)
        row.trace_timestamp_ms = info.request_time
        assessments.append({c: getattr(row, c) for c in columns if getattr(row, c) is not None})
    return {
        "trace_info": [trace_info],
        "trace_tags": [{"request_id": trace_id, "key": k, "value": v} for k, v in tags.items()],
        "trace_request_metadata": [
            {"request_id": trace_id, "key": k, "value": v} for k, v in sorted(metadata.items())
        ],
        "assessments": assessments,
        "spans": [span_row],
    }


def insert_traces(store: Any, experiment_id: str, traces: list[tuple[Any, Any]]) -> int:
    """Insert the traces (info, assessments, root span) not yet in the database store, all in
    one transaction; returns how many were new. A trace id already there was committed whole
    by an earlier export of the same run, so it is left as it is."""
    from mlflow.store.tracking.dbmodels.models import Base
    from mlflow.store.tracking.utils.sql_trace_rollups import (
        RollupFamily,
        enqueue_rollup_rebuild_partitions,
    )

    experiment = store.get_experiment(experiment_id)
    store._check_experiment_is_active(experiment)
    with store.ManagedSessionMaker(read_only=False) as session:
        present = store._get_existing_trace_ids(session, [info.trace_id for info, _ in traces])
        new = [(info, span) for info, span in traces if info.trace_id not in present]
        if not new:
            return 0
        times = [info.request_time for info, _ in new]
        families = (RollupFamily.TRACE_METRIC, RollupFamily.ASSESSMENT, RollupFamily.SPAN_COST)
        enqueue_rollup_rebuild_partitions(session, [(f, int(experiment_id), times) for f in families])
        tables: dict[str, list[dict[str, Any]]] = {
            "trace_info": [], "trace_tags": [], "trace_request_metadata": [], "assessments": [], "spans": [],
        }  # fmt: skip
        for info, span in new:
            for table, rows in _sql_rows(store, experiment, info, span).items():
                tables[table].extend(rows)
        for table, rows in tables.items():  # trace_info first: the others refer to it
            # one executemany per set of columns: it compiles its statement from the first row
            # and would drop a later row's extra columns (a trace's token totals, say)
            by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for row in rows:
                by_columns.setdefault(tuple(row), []).append(row)
            for same in by_columns.values():
                session.execute(Base.metadata.tables[table].insert(), same)
    return len(new)


def _batches_into(store: Any) -> bool:
    """Whether ``store`` takes the batch: a database store of a release whose tables the
    row-for-row test compared (``BATCHED_RELEASES``); any other release gets MLflow's own calls."""
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    return isinstance(store, SqlAlchemyStore) and mlflow.__version__.startswith(BATCHED_RELEASES)


def log_rollout_traces(
    store: Any,
    experiment_id: str,
    run_id: str,
    rollouts: Iterable[Rollout],
    fallback_ms: int,
    secrets: frozenset[str] = frozenset(),
) -> int:
    """Write one trace per rollout (a trace already there is kept, never doubled); returns how
    many rollouts were traced. Memory is bounded by the batch, not the rows."""
    database = _batches_into(store)
    batch_size = BATCH if database else LINKS
    count = 0
    batch: list[tuple[Any, Any]] = []

    def flush() -> None:
        if database:
            insert_traces(store, experiment_id, batch)
        else:
            for info, _ in batch:
                store.start_trace(info)
            store.log_spans(experiment_id, [span for _, span in batch])
        ids = [info.trace_id for info, _ in batch]
        for start in range(0, len(ids), LINKS):
            store.link_traces_to_run(ids[start : start + LINKS], run_id)
        batch.clear()

    for r in rollouts:
        batch.append(build_trace(r, experiment_id, run_id, fallback_ms, secrets))
        count += 1
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return count
