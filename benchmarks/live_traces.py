"""Live traces (issue 40): rollouts handed to ``export_rollouts`` during a live run become traces
on the backend's worker. Three figures, each against a baseline measured in the same run:

1. the caller's cost of ``export_rollouts`` (one NeMo Gym rollout a call, a short pause between
   calls as an eval's pace) with MLflow's live traces on, against the same live run with them off
   (today's cost: journal-free hashing and a queue append); Phoenix's live traces beside it. The
   traces-off run is made before and after the traces-on one and their calls pooled, so that a
   change of the machine's load during the run does not read as the traces' cost;
2. memory over ``MEMORY_ROWS`` live rollouts with traces on (a fresh process each, peak RSS
   above the imports) against a tenth of them: constant when the ratio stays near 1;
3. traces a second reaching each platform live (sent / time from the first call until the
   platform took the last), against its ingestion floor measured in the same run: MLflow's store
   alone (``SqlAlchemyStore.start_trace`` + ``log_spans`` in-process, ``benchmarks.traces``),
   Phoenix's post-run trace export of the same rollouts (OTLP + annotations in batches of 500).

``GYM_BENCH_LIVE_TRACES=mlflow,phoenix`` picks the platforms (``--tiny``: MLflow only).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Row, median, run_measured

CALLS = 2_000
MEMORY_ROWS = 100_000
PAUSE_EVERY, PAUSE_S = 10, 0.005  # 2,000 rollouts a second at most: a fast eval's pace

MEMORY = """
import time
from gym_artifacts.core.jsonio import iter_jsonl
from gym_artifacts.live import live_run
records = [r for _, r in iter_jsonl({source!r})]
cfg = {{'exporters': {{'mlflow': {{'enabled': True, 'tracking_uri': {uri!r}, 'experiment_name': 'memory',
        'log_traces': True}}}}}}
__base = peak_rss_mb()
with live_run(cfg, {out!r}, teardown_timeout=5, teardown_hard_cap=30) as live:
    live.flush(60)
    for i in range({rows}):
        record = dict(records[i % len(records)], _ng_task_index=i // 4, _ng_rollout_index=i % 4)
        live.export_rollouts([record])
        if i % EVERY == EVERY - 1:
            time.sleep(PAUSE)
[report] = live.reports
__result['above_mb'] = peak_rss_mb() - __base
__result['sent'] = report.traces.sent
__result['left'] = report.traces.left_for_export
"""


def _records(dpath: Path, n: int) -> tuple[Path, list[Any]]:
    from gym_artifacts.core.jsonio import iter_jsonl
    from tests.nemo_gym_runs import write_run

    out = write_run(dpath / "run.jsonl", tasks=max(1, n // 4), repeats=4)
    return out, [record for _, record in iter_jsonl(out)]


def _live_costs(cfg: dict, out: Path, records: list[Any]) -> tuple[list[float], float, Any]:
    """Microseconds of each ``export_rollouts`` call, the seconds until every backend took every
    call (its traces sent), and the report."""
    from gym_artifacts.live import live_run

    costs: list[float] = []
    with live_run(cfg, out, teardown_timeout=30, teardown_hard_cap=600) as live:
        live.flush(120)
        export, clock = live.export_rollouts, time.perf_counter_ns
        started = time.perf_counter()
        for i, record in enumerate(records):
            t0 = clock()
            export([record])
            costs.append((clock() - t0) / 1000)
            if i % PAUSE_EVERY == PAUSE_EVERY - 1:
                time.sleep(PAUSE_S)
        live.flush(600)
        for channel in live.channels:  # the traces still waiting get their turns on the worker
            traces = getattr(channel.backend, "live_traces", None)  # a LiveTracing backend's queue
            while traces is not None and traces.due and time.perf_counter() - started < 600:
                time.sleep(0.02)
        landed = time.perf_counter() - started
    return costs, landed, live.reports


def _on_and_off(
    off_cfg: dict, on_cfg: dict, tmp: Path, records: list[Any]
) -> tuple[list[float], list[float], float, Any]:
    """The caller's costs with traces on, and off (one run before the traces-on run and one
    after, pooled), the seconds until the platform took every trace, and the traces-on report."""
    before, _, _ = _live_costs(off_cfg, tmp / "off-before" / "out.jsonl", records)
    on, landed, reports = _live_costs(on_cfg, tmp / "on" / "out.jsonl", records)
    after, _, _ = _live_costs(off_cfg, tmp / "off-after" / "out.jsonl", records)
    return on, before + after, landed, reports


def _memory(source: Path, uri: str, out: Path, rows: int) -> dict[str, float]:
    code = MEMORY.format(source=str(source), uri=uri, out=str(out), rows=rows)
    return run_measured(code.replace("EVERY", str(PAUSE_EVERY)).replace("PAUSE", str(PAUSE_S)))


def _sent(reports: Any, name: str) -> int:
    report = next(r for r in reports if r.exporter == name)
    return report.traces.sent if report.traces is not None else 0


def _mlflow_floor(source: Path, rows: int) -> float:
    """Traces a second MLflow's store alone takes (in-process, no HTTP)."""
    from benchmarks.traces import MLFLOW_FLOOR

    floor = run_measured(MLFLOW_FLOOR.format(out=str(source), rows=rows))
    return floor["rows"] / (floor["start_trace"] + floor["log_spans"])


def _phoenix_floor(url: str, source: Path, n: int) -> float:
    """Traces a second of Phoenix's post-run trace export of the same rollouts."""
    from benchmarks.traces import _export

    section = {"enabled": True, "base_url": url, "project_name": "floor", "log_experiment": False}
    got = _export(source, {"phoenix": section}, "phoenix.client")
    return n / got["wall"]


def run(tiny: bool) -> list[Row]:
    from benchmarks.common import mlflow_server

    default = "mlflow" if tiny else "mlflow,phoenix"
    parts = [p for p in os.environ.get("GYM_BENCH_LIVE_TRACES", default).split(",") if p]
    calls = 200 if tiny else CALLS
    memory_rows = 2_000 if tiny else MEMORY_ROWS
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-live-traces-") as tmp_name:
        tmp = Path(tmp_name)
        source, records = _records(tmp / "source", calls)
        records = records[:calls]
        with mlflow_server(tmp / "mlflow", tiny) as server:
            section = {"enabled": True, "tracking_uri": server.uri, "log_traces": False}
            off_cfg = {"exporters": {"mlflow": {**section, "experiment_name": "off"}}}
            on_cfg = {"exporters": {"mlflow": {**section, "experiment_name": "on", "log_traces": True}}}
            on, off, landed, reports = _on_and_off(off_cfg, on_cfg, tmp / "mlflow-calls", records)
            floor = _mlflow_floor(source, 20 if tiny else 1000)
            sizes = (memory_rows // 10, memory_rows)
            memory = [_memory(source, server.uri, tmp / f"m{n}" / "out.jsonl", n) for n in sizes]
        ratio = median(on) / median(off)
        rows.append(Row(
            "live traces: export_rollouts caller's cost, MLflow traces on",
            f"median {median(on):.1f} us", f"traces off {median(off):.1f} us", ratio, "<= 1.2x", ratio <= 1.2,
        ))  # fmt: skip
        sent = _sent(reports, "mlflow")
        rate = sent / landed
        rows.append(Row(
            f"live traces: {sent:,} of {calls:,} rollouts reached an mlflow server live",
            f"{rate:,.0f} traces/s", f"MLflow's store alone {floor:,.0f} traces/s", rate / floor,
            "all sent; the platform's floor", sent == calls,
        ))  # fmt: skip
        small, large = memory
        growth = large["above_mb"] / max(small["above_mb"], 1.0)
        rows.append(Row(
            f"live traces: memory over {memory_rows:,} live rollouts (MLflow traces on)",
            f"+{large['above_mb']:.0f} MB ({large['sent']:,} sent live, {large['left']:,} to the export)",
            f"{memory_rows // 10:,} rollouts +{small['above_mb']:.0f} MB", growth, "constant (<= 1.5x)",
            growth <= 1.5,
        ))  # fmt: skip
        if "phoenix" in parts:
            rows += _phoenix(tmp, source, records)
    return rows


def _phoenix(tmp: Path, source: Path, records: list[Any]) -> list[Row]:
    from tests.phoenix_server import PhoenixServer, phoenix_bin

    binary = phoenix_bin()
    if binary is None:
        return [Row("live traces: Phoenix", "skipped: no phoenix binary", "", None, "", None)]
    server = PhoenixServer(tmp / "phoenix", binary).start()
    try:
        section = {"enabled": True, "base_url": server.url, "project_name": "live", "log_experiment": False}
        off_cfg = {"exporters": {"phoenix": {**section, "log_traces": False}}}
        on_cfg = {"exporters": {"phoenix": section}}
        on, off, landed, reports = _on_and_off(off_cfg, on_cfg, tmp / "px", records)
        floor = _phoenix_floor(server.url, source, len(records))
    finally:
        server.stop()
    ratio = median(on) / median(off)
    sent = _sent(reports, "phoenix")
    rate = sent / landed
    return [
        Row("live traces: export_rollouts caller's cost, Phoenix traces on", f"median {median(on):.1f} us",
            f"traces off {median(off):.1f} us", ratio, "<= 1.2x", ratio <= 1.2),
        Row(f"live traces: {sent:,} of {len(records):,} rollouts reached phoenix serve live",
            f"{rate:,.0f} traces/s", f"post-run trace export {floor:,.0f} traces/s", rate / floor,
            "all sent; the platform's floor", sent == len(records)),
    ]  # fmt: skip
