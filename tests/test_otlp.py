"""The OTLP request both trace backends receive (exporters/_otlp.py): any JSON a rollout holds
(lone surrogates, integers past 64 bits, NaN, deep nesting) encodes into a request that parses back
to the same values, as MLflow's and Phoenix's collectors decode it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_artifacts._builtin_exporters._otlp import export_request
from gym_artifacts.run.rollout_spans import rollout_trace


def decoded(pb: Any) -> Any:
    """An AnyValue as a collector decodes it (MLflow's ``_decode_otel_proto_anyvalue``)."""
    kind = pb.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decoded(v) for v in pb.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: decoded(kv.value) for kv in pb.kvlist_value.values}
    return getattr(pb, kind)


def expected(value: Any) -> Any:
    """What survives the wire: text as valid UTF-8, numbers protobuf cannot hold as text."""
    if isinstance(value, dict):
        return {expected_text(str(k)): expected(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expected(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return expected_text(value)


def expected_text(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=25,
)  # fmt: skip


def _first_value(value: Any) -> Any:
    trace = rollout_trace("s", 0, {"responses_create_params": {"input": "hi"}, "response": {"output": []}}, 1.0)
    body = export_request([trace], lambda t, s: {"v": value}, {"service.name": "x"})
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    [span] = request.resource_spans[0].scope_spans[0].spans
    if not span.attributes:  # a None attribute is left out
        return None
    [attribute] = span.attributes
    return decoded(attribute.value)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
@example(value={"text": "\ud800 lone surrogate", "big": 2**64, "nan": float("nan"), "inf": float("-inf")})
def test_any_json_value_crosses_the_wire(value: Any) -> None:
    got = _first_value(value)
    want = expected(value)
    if value is None:
        assert got is None
    else:
        assert repr(got) == repr(want)  # repr: NaN never equals itself


@pytest.mark.parametrize("levels", [50, 128, 3000])
def test_deep_values_still_parse(levels: int) -> None:
    """A rollout may nest 256 levels (the reader's limit) and protobuf decoders refuse 100: past
    MAX_NESTING the rest of the value travels as its JSON text, and the request parses."""
    from gym_artifacts._builtin_exporters._otlp import MAX_NESTING

    deep: Any = "leaf"
    for _ in range(levels):
        deep = {"k": [deep]}
    got = _first_value(deep)
    for _ in range(MAX_NESTING // 2):
        got = got["k"][0]
    assert isinstance(got, str)
    if levels < 300:  # within what json can write, the text is the rest of the value
        rest = json.loads(got)
        for _ in range(levels - MAX_NESTING // 2):
            rest = rest["k"][0]
        assert rest == "leaf"
