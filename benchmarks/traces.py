"""Rollouts as traces at scale: a NeMo Gym 0.7 run (tests/nemo_gym_runs.py: tool calls, 2 % failed
rollouts) exported to a real ``mlflow server`` (OTLP ``/v1/traces`` + one ``start_trace`` a trace)
and to a real ``phoenix serve`` (OTLP + annotations in batches), each with its wall time and memory
above the imports, next to the platform's own per-item calls measured in the same run on
``OWN_ROWS`` rollouts: MLflow's public tracing calls (``start_trace``/``start_span``/``end_span``/
``end_trace`` a rollout, synchronous) and Phoenix's per-rollout experiment runs (``log_run`` +
``log_evaluation``, this exporter's experiment path).

Where the MLflow time goes: the export is instrumented (time inside ``start_trace`` requests,
4 in flight, and inside OTLP requests), so a ceiling that is the server's own ingestion shows.

MLflow's floor is measured beside it: its own ``SqlAlchemyStore.start_trace`` and ``log_spans``
called in-process on a fresh SQLite file for ``FLOOR_ROWS`` of the same traces (no HTTP, no
client): what the server's store alone costs a trace, whoever sends it.

``GYM_BENCH_TRACES=mlflow,phoenix`` picks parts (``--tiny`` leaves out Phoenix: its server alone
takes minutes to start); ``GYM_BENCH_TRACES_ROWS`` sets the size (default 100,000);
``GYM_BENCH_TRACES_MLFLOW=assessments,spans`` picks MLflow's variants (with ``start_trace`` and
the spans alone; both by default).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks.common import Row, run_measured

ROWS = 100_000
OWN_ROWS = 300
FLOOR_ROWS = 1000
TARGET_S = 600.0  # 10 minutes for 100,000 rollouts
REPEATS = 4
PARTS = ("mlflow", "phoenix")

EXPORT = """
import time
from omegaconf import OmegaConf
from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import ScopedMlflow
import gym_artifacts.run.identity, {imports}
spent = {{"otlp": 0.0, "start_trace": 0.0, "landed_wait": 0.0, "annotations": 0.0}}
def timed(key, fn):
    def wrapper(*a, **kw):
        s = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[key] += time.perf_counter() - s
    return wrapper
from mlflow.store.tracking.rest_store import RestStore
ScopedMlflow.post_otlp = timed("otlp", ScopedMlflow.post_otlp)
RestStore.start_trace = timed("start_trace", RestStore.start_trace)  # summed over the 4 threads
try:
    from phoenix.client.resources.spans import Spans
    # Phoenix storing the spans it was sent: the export asks for them until they are all there
    Spans.get_spans = timed("landed_wait", Spans.get_spans)
    Spans.log_span_annotations = timed("annotations", Spans.log_span_annotations)
except ImportError:
    pass
__base = peak_rss_mb()
cfg = OmegaConf.create({{'exporters': {section!r}}})
t0 = time.perf_counter()
[r] = export_run({out!r}, cfg)
assert r.status.value == 'EXPORTED', r.reason
__result['wall'] = time.perf_counter() - t0
__result['base_rss_mb'] = __base
__result['above_mb'] = peak_rss_mb() - __base
__result.update(spent)
"""

MLFLOW_OWN = """
import os, time
os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"
import mlflow
from mlflow import MlflowClient
from gym_artifacts.core.jsonio import iter_jsonl
from gym_artifacts.run.rollout_spans import rollout_trace
mlflow.set_tracking_uri({uri!r})
client = MlflowClient({uri!r})
exp = client.create_experiment("own-calls")
run = client.create_run(exp).info.run_id
rows = [rec for _, rec in iter_jsonl({out!r})][:{rows}]
t0 = time.perf_counter()
for i, rec in enumerate(rows):
    tr = rollout_trace("own", i, rec, 0.0)
    root = tr.spans[0]
    live = client.start_trace("rollout", span_type=root.kind, inputs=root.inputs, tags=tr.tags,
                              experiment_id=exp, start_time_ns=root.start_ns, run_id=run)
    for s in tr.spans[1:]:
        child = client.start_span(s.name, trace_id=live.trace_id, parent_id=live.span_id, span_type=s.kind,
                                  inputs=s.inputs, start_time_ns=s.start_ns)
        client.end_span(live.trace_id, child.span_id, outputs=s.outputs, end_time_ns=s.end_ns)
    client.end_trace(live.trace_id, outputs=root.outputs, end_time_ns=root.end_ns)
    for name, value in tr.feedback.items():
        mlflow.log_feedback(trace_id=live.trace_id, name=name, value=value)
__result['wall'] = time.perf_counter() - t0
__result['rows'] = len(rows)
"""


MLFLOW_FLOOR = """
import time, tempfile
from pathlib import Path
from mlflow.entities import Span
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from gym_artifacts._builtin_exporters.mlflow import batch_requests
from gym_artifacts.core.jsonio import iter_jsonl
from gym_artifacts.run.rollout_spans import rollout_trace
tmp = Path(tempfile.mkdtemp(prefix="gymart-floor-"))
store = SqlAlchemyStore(f"sqlite:///{{tmp}}/floor.db", str(tmp / "artifacts"))
exp = store.create_experiment("floor")
run_id = "0" * 32
traces = [rollout_trace("floor", i, rec, 0.0) for i, (_, rec) in enumerate(iter_jsonl({out!r})) if i < {rows}]
spent = {{"start_trace": 0.0, "log_spans": 0.0}}
for _, infos, body in batch_requests(traces, exp, run_id, batch=200):
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    resource = request.resource_spans[0].resource
    otel_spans = request.resource_spans[0].scope_spans[0].spans
    spans = [Span.from_otel_proto(s, resource=resource) for s in otel_spans]
    t0 = time.perf_counter()
    for info in infos:
        store.start_trace(info)
    t1 = time.perf_counter()
    store.log_spans(exp, spans)
    spent["start_trace"] += t1 - t0
    spent["log_spans"] += time.perf_counter() - t1
__result.update(spent)
__result['rows'] = len(traces)
"""


def _run(dpath: Path, rows: int) -> Path:
    from tests.nemo_gym_runs import write_run

    tasks = max(1, rows // REPEATS)
    failing = range(0, tasks, 50)  # 2 % of the tasks fail, every repeat
    return write_run(dpath / "run.jsonl", tasks=tasks, repeats=REPEATS, failing_tasks=failing)


def _export(out: Path, section: dict, imports: str) -> dict:
    out.with_name(f".{out.stem}.gymart-identities.json").unlink(missing_ok=True)
    for receipt in out.parent.glob(f"{out.stem}_*_export_done.json"):
        receipt.unlink()
    return run_measured(EXPORT.format(imports=imports, section=section, out=str(out)))


def _mlflow(tmp: Path, out: Path, n: int, tiny: bool) -> list[Row]:
    from tests.mlflow_server import MlflowServer, free_port

    variants = os.environ.get("GYM_BENCH_TRACES_MLFLOW", "assessments,spans").split(",")
    floor = run_measured(MLFLOW_FLOOR.format(out=str(out), rows=20 if tiny else FLOOR_ROWS))
    floor_ms = {k: floor[k] / floor["rows"] * 1000 for k in ("start_trace", "log_spans")}
    server = MlflowServer(tmp / "mlflow", free_port()).start()
    measured = []
    try:
        base = {"enabled": True, "tracking_uri": server.uri, "log_traces": True}
        if "assessments" in variants:
            got = _export(out, {"mlflow": {**base, "experiment_name": "traces"}}, "mlflow")
            measured.append(("OTLP + start_trace", got, floor_ms["start_trace"] + floor_ms["log_spans"]))
        if "spans" in variants:
            spans_only = {**base, "experiment_name": "spans", "trace_assessments": False}
            got = _export(out, {"mlflow": spans_only}, "mlflow")
            measured.append(("OTLP only, trace_assessments=false", got, floor_ms["log_spans"]))
        plain = _export(out, {"mlflow": {**base, "experiment_name": "plain", "log_traces": False}}, "mlflow")
        own_rows = 20 if tiny else OWN_ROWS
        own = run_measured(MLFLOW_OWN.format(uri=server.uri, out=str(out), rows=own_rows))
    finally:
        server.stop()
    own_per = own["wall"] / own["rows"]
    rows = []
    for label, got, floor_per_ms in measured:
        per = (got["wall"] - plain["wall"]) / n
        projected = got["wall"] * ROWS / n
        rows.append(
            Row(
                f"traces: {n:,} rollouts to an mlflow server ({label})",
                f"{got['wall']:.1f} s ({per * 1000:.2f} ms a trace; start_trace {got['start_trace']:.0f} s "
                f"summed over 4 threads, OTLP {got['otlp']:.0f} s), +{got['above_mb']:.0f} MB; "
                f"without traces {plain['wall']:.1f} s; MLflow's store alone {floor_per_ms:.1f} ms a trace "
                f"(start_trace {floor_ms['start_trace']:.1f} + log_spans {floor_ms['log_spans']:.1f}, "
                f"in-process, {floor['rows']} traces: {floor_per_ms * ROWS / 1000:.0f} s for {ROWS:,})",
                f"MLflow's own calls {own_per * 1000:.1f} ms a trace ({own['rows']} rollouts)",
                own_per / per if per > 0 else None,
                f"<= {TARGET_S:.0f} s for {ROWS:,} (projected {projected:.0f} s), memory constant",
                projected <= TARGET_S and got["above_mb"] <= 200,
                got["above_mb"] + got["base_rss_mb"],
            )
        )
    return rows


def _phoenix(tmp: Path, out: Path, n: int, tiny: bool) -> list[Row]:
    from tests.phoenix_server import PhoenixServer, phoenix_bin

    binary = phoenix_bin()
    if binary is None:
        return [Row("traces: Phoenix", "skipped: no phoenix binary", "", None, "", None)]
    server = PhoenixServer(tmp / "phoenix", binary).start()
    try:
        base = {"enabled": True, "base_url": server.url}
        section = {**base, "project_name": "traces", "log_experiment": False}
        ours = _export(out, {"phoenix": section}, "phoenix.client")
        own_rows = 20 if tiny else OWN_ROWS
        small = _run(tmp / "own", own_rows)
        own = _export(small, {"phoenix": {**base, "log_traces": False}}, "phoenix.client")
    finally:
        server.stop()
    per = ours["wall"] / n
    own_per = own["wall"] / own_rows
    projected = ours["wall"] * ROWS / n
    return [
        Row(
            f"traces: {n:,} rollouts to phoenix serve (OTLP + annotations)",
            f"{ours['wall']:.1f} s ({per * 1000:.2f} ms a trace; asking Phoenix whether it stored the spans "
            f"{ours['landed_wait']:.0f} s, annotations {ours['annotations']:.0f} s), "
            f"+{ours['above_mb']:.0f} MB",
            f"per-rollout experiment runs {own_per * 1000:.1f} ms a rollout ({own_rows} rollouts)",
            own_per / per if per > 0 else None,
            f"<= {TARGET_S:.0f} s for {ROWS:,} (projected {projected:.0f} s), memory constant",
            projected <= TARGET_S and ours["above_mb"] <= 200,
            ours["above_mb"] + ours["base_rss_mb"],
        )
    ]


def run(tiny: bool) -> list[Row]:
    default = PARTS[:1] if tiny else PARTS
    parts = [p for p in os.environ.get("GYM_BENCH_TRACES", ",".join(default)).split(",") if p]
    n = 40 if tiny else int(os.environ.get("GYM_BENCH_TRACES_ROWS", ROWS))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-traces-") as tmp_name:
        tmp = Path(tmp_name)
        out = _run(tmp / "run", n)
        n = out.read_bytes().count(b"\n") + out.with_name("run_failures.jsonl").read_bytes().count(b"\n")
        if "mlflow" in parts:
            rows += _mlflow(tmp, out, n, tiny)
        if "phoenix" in parts:
            rows += _phoenix(tmp, out, n, tiny)
    return rows
