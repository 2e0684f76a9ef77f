"""Rollout traces as one OTLP/HTTP protobuf request (``ExportTraceServiceRequest``).

MLflow (3.6+ servers, ``/v1/traces``) and Phoenix (an OpenTelemetry collector, ``/v1/traces``)
ingest the same wire format; each backend names its own attributes (``attributes_of``), this
module only encodes. ``opentelemetry-proto`` is imported when a request is built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gym_artifacts.plugin import RolloutTrace, Span

SCOPE = "gym-artifacts"
# Protobuf decoders refuse messages nested past 100 levels (each JSON level costs 2-3 messages,
# the envelope 5): a value nested deeper than this goes as its JSON text instead.
MAX_NESTING = 24


def _clean_text(text: str) -> str:
    """Text protobuf can carry (valid UTF-8: lone surrogates replaced)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _as_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):
        return "<value nested too deep to encode>"


def set_value(target: Any, value: Any) -> None:
    """Fill an OTLP ``AnyValue`` from a JSON-like value (nested objects as key-value lists, a
    subtree deeper than ``MAX_NESTING`` as its JSON text)."""
    stack = [(target, value, 0)]
    while stack:  # iterative: a deep value must not hit the recursion limit
        pb, v, depth = stack.pop()
        if v is None:
            continue
        if depth >= MAX_NESTING and isinstance(v, list | tuple | dict):
            pb.string_value = _clean_text(_as_text(v))
            continue
        if isinstance(v, bool):
            pb.bool_value = v
        elif isinstance(v, int):
            if -(2**63) <= v < 2**63:
                pb.int_value = v
            else:
                pb.string_value = str(v)
        elif isinstance(v, float):
            if math.isfinite(v):
                pb.double_value = v
            else:
                pb.string_value = str(v)
        elif isinstance(v, str):
            pb.string_value = _clean_text(v)
        elif isinstance(v, list | tuple):
            values = pb.array_value.values
            pb.array_value.SetInParent()
            stack.extend((values.add(), item, depth + 1) for item in v)
        elif isinstance(v, dict):
            pairs = pb.kvlist_value.values
            pb.kvlist_value.SetInParent()
            for key, item in v.items():
                kv = pairs.add()
                kv.key = _clean_text(str(key))
                stack.append((kv.value, item, depth + 1))
        else:
            pb.string_value = _clean_text(str(v))


def _add_span(scope_spans: Any, trace: RolloutTrace, span: Span, attributes: dict[str, Any]) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    pb = scope_spans.spans.add()
    pb.trace_id = bytes.fromhex(trace.trace_id)
    pb.span_id = bytes.fromhex(span.span_id)
    if span.parent_id:
        pb.parent_span_id = bytes.fromhex(span.parent_id)
    pb.name = _clean_text(span.name)
    pb.kind = 1  # SPAN_KIND_INTERNAL
    pb.start_time_unix_nano = span.start_ns
    pb.end_time_unix_nano = span.end_ns
    for key, value in attributes.items():
        if value is None:
            continue
        kv = pb.attributes.add()
        kv.key = key
        set_value(kv.value, value)
    if span.error is not None:
        pb.status.code = Status.STATUS_CODE_ERROR
        pb.status.message = _clean_text(span.error)
        event = pb.events.add()
        event.name = "exception"
        event.time_unix_nano = span.end_ns
        for key, value in (("exception.type", span.attributes.get("failure_type", "Error")),
                           ("exception.message", span.error)):  # fmt: skip
            kv = event.attributes.add()
            kv.key = key
            set_value(kv.value, str(value))
    else:
        pb.status.code = Status.STATUS_CODE_OK


def export_request(
    traces: Iterable[RolloutTrace],
    attributes_of: Callable[[RolloutTrace, Span], dict[str, Any]],
    resource: dict[str, Any],
) -> bytes:
    """One serialized ``ExportTraceServiceRequest`` holding every span of ``traces``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for key, value in resource.items():
        kv = resource_spans.resource.attributes.add()
        kv.key = key
        set_value(kv.value, value)
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = SCOPE
    for trace in traces:
        for span in trace.spans:
            _add_span(scope_spans, trace, span, attributes_of(trace, span))
    return bytes(request.SerializeToString())


def trace_batches(traces: Iterable[RolloutTrace], size: int) -> Iterator[list[RolloutTrace]]:
    """``traces`` in lists of at most ``size`` (one OTLP request each), streamed."""
    batch: list[RolloutTrace] = []
    for trace in traces:
        batch.append(trace)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
