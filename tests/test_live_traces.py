"""Live traces: rollouts handed to ``export_rollouts`` during a live run appear as traces in the
platform while the eval runs, and the post-run export adds only what is missing (issue 40).

Against a real ``mlflow server``: a live run logging 200 NeMo Gym rollouts over about 20 seconds;
traces read back through MLflow's client grow while it runs (at least half before teardown), all
200 after teardown, and after ``export`` still 200 traces, one run, no duplicate trace or
feedback; the same with the server killed for part of the run and restarted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live.fanout import live_run
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.load import scaled
from tests.mlflow_server import MlflowServer

ROLLOUTS = 200
SPACING_S = 0.1  # 200 rollouts over about 20 seconds


def nemo_gym_rollouts(n: int) -> list[dict[str, Any]]:
    """``n`` real NeMo Gym 0.7.0 rollout lines (the clean fixture's, each its own task and repeat)."""
    lines = (NEMO_GYM_FIXTURES / "clean" / "rollouts.jsonl").read_text().splitlines()
    base = [json.loads(line) for line in lines]
    out = []
    for i in range(n):
        record = json.loads(json.dumps(base[i % len(base)]))
        record["_ng_task_index"], record["_ng_rollout_index"] = i // 2, i % 2
        record["response"]["created_at"] = record["response"]["created_at"] + i
        out.append(record)
    return out


def mlflow_cfg(uri: str, experiment: str) -> dict[str, Any]:
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": experiment, "log_traces": True}
    return {"exporters": {"mlflow": section}}


def trace_infos(client: MlflowClient, experiment_id: str) -> list[Any]:
    found: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], max_results=500, page_token=token, include_spans=False
        )
        found.extend(page)
        token = page.token
        if not token:
            return found


def experiment_id(client: MlflowClient, name: str) -> str | None:
    experiment = client.get_experiment_by_name(name)
    return None if experiment is None else str(experiment.experiment_id)


def run_eval(out: Path, live: Any, records: list[dict[str, Any]], between: Any = None) -> None:
    """The eval: each rollout written to OUT.jsonl as it finishes, then handed to export_rollouts."""
    with open(out, "ab") as fh:
        for i, record in enumerate(records):
            fh.write(json.dumps(record).encode() + b"\n")
            fh.flush()
            live.export_rollouts([record])
            if between is not None:
                between(i)
            time.sleep(SPACING_S)


def write_aggregate(out: Path) -> None:
    """What NeMo Gym writes once collection ends: the aggregate metrics beside OUT.jsonl."""
    aggregate = (NEMO_GYM_FIXTURES / "clean" / "rollouts_aggregate_metrics.json").read_bytes()
    out.with_name(f"{out.stem}_aggregate_metrics.json").write_bytes(aggregate)


def assert_exactly_once(client: MlflowClient, experiment: str, records: list[dict[str, Any]]) -> None:
    """One trace per rollout (by task and repeat), one reward feedback each, one run; the views'
    span types (AGENT, CHAT_MODEL, TOOL) and token usage as the post-run traces carry them."""
    exp = experiment_id(client, experiment)
    assert exp is not None
    infos = trace_infos(client, exp)
    ids = [t.info.trace_id for t in infos]
    assert len(ids) == len(set(ids)) == len(records)
    placed = {(t.info.tags["gym_artifacts.task"], t.info.tags["gym_artifacts.repeat"]) for t in infos}
    assert placed == {(str(r["_ng_task_index"]), str(r["_ng_rollout_index"])) for r in records}
    for t in infos:
        rewards = [a for a in t.info.assessments if a.name == "reward"]
        assert len(rewards) == 1, t.info.trace_id
    runs = client.search_runs([exp])
    assert len(runs) == 1
    linked = {t.info.request_metadata.get("mlflow.sourceRun") for t in infos}
    assert linked == {runs[0].info.run_id}
    trace = client.get_trace(infos[0].info.trace_id)
    kinds = {s.span_type for s in trace.data.spans}
    assert {"AGENT", "CHAT_MODEL"} <= kinds
    assert trace.info.token_usage and trace.info.token_usage["total_tokens"] > 0


@pytest.mark.slow
def test_live_traces_grow_while_the_eval_runs_and_the_export_adds_none(
    own_mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    server = own_mlflow_server.start()
    client = MlflowClient(server.uri)
    out = tmp_path / "eval.jsonl"
    records = nemo_gym_rollouts(ROLLOUTS)
    cfg = mlflow_cfg(server.uri, "live-traces")
    seen: list[int] = []

    def watch(i: int) -> None:
        if i % 50 == 49:
            exp = experiment_id(client, "live-traces")
            seen.append(len(trace_infos(client, exp)) if exp else 0)

    with live_run(cfg, out, teardown_timeout=30.0, teardown_hard_cap=120.0) as live:
        run_eval(out, live, records, watch)
        exp = experiment_id(client, "live-traces")
        assert exp is not None
        before_teardown = len(trace_infos(client, exp))
    [report] = live.reports
    assert report.lost == 0, report.describe()
    assert seen == sorted(seen) and seen[-1] > seen[0] > 0  # traces grew while the eval ran
    assert before_teardown >= ROLLOUTS // 2
    assert len(trace_infos(client, exp)) == ROLLOUTS
    assert report.traces is not None and report.traces.sent == ROLLOUTS, report.describe()
    assert f"{ROLLOUTS} traces" in report.describe()
    write_aggregate(out)
    [result] = export_run(out, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert_exactly_once(client, "live-traces", records)


@pytest.mark.slow
@pytest.mark.parametrize("back", ["during-the-run", "after-teardown"])
def test_live_traces_with_the_server_killed_and_restarted_end_exactly_once(
    own_mlflow_server: MlflowServer, tmp_path: Path, back: str
) -> None:
    """The server is killed at rollout 60 and comes back at rollout 120 (the live run sends what
    waited) or only after the eval ended (the export sends what the live run could not): exactly
    200 traces either way, and the eval's calls never wait on the server."""
    server = own_mlflow_server.start()
    client = MlflowClient(server.uri)
    out = tmp_path / "eval.jsonl"
    records = nemo_gym_rollouts(ROLLOUTS)
    cfg = mlflow_cfg(server.uri, f"live-traces-{back}")
    calls: list[float] = []

    def outage(i: int) -> None:
        if i == 60:
            server.stop()
        if i == 120 and back == "during-the-run":
            server.start()

    with live_run(cfg, out, teardown_timeout=30.0, teardown_hard_cap=120.0) as live:
        original = live.export_rollouts

        def timed(rollouts: list[Any]) -> None:
            t0 = time.perf_counter()
            original(rollouts)
            calls.append(time.perf_counter() - t0)

        live.export_rollouts = timed  # type: ignore[method-assign]
        run_eval(out, live, records, outage)
    assert max(calls) < scaled(0.5)  # a tracker down never slows the eval
    [report] = live.reports
    traces = report.traces
    assert traces is not None and traces.sent + traces.left_for_export == ROLLOUTS, report.describe()
    if back == "during-the-run":  # the server took traces live; how many depends on the machine's load
        assert traces.sent > 0, report.describe()
    else:
        assert traces.left_for_export >= ROLLOUTS - 60 and traces.failed_attempts > 0, report.describe()
        assert "left for the export" in report.describe()
        server.start()
    write_aggregate(out)
    [result] = export_run(out, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert_exactly_once(client, f"live-traces-{back}", records)


@pytest.mark.slow
def test_the_nemo_gym_drop_in_sends_live_traces(own_mlflow_server: MlflowServer, tmp_path: Path) -> None:
    """NeMo Gym's call sites (``gym_artifacts.nemo_gym``, its flat MLflow keys): each
    ``export_rollouts`` call's rollouts are traces once ``teardown_exporters`` returns, the
    failed ones (``route_failures_to_sidecar``) as ERROR traces, and the export adds none."""
    from gym_artifacts import nemo_gym

    server = own_mlflow_server.start()
    client = MlflowClient(server.uri)
    out = tmp_path / "eval.jsonl"
    records = nemo_gym_rollouts(20)
    failed = [json.loads(line) for line in (NEMO_GYM_FIXTURES / "with-failures" / "rollouts_failures.jsonl")
              .read_text().splitlines()]  # fmt: skip
    config = {
        "output_jsonl_fpath": str(out), "mlflow_tracking_uri": server.uri, "mlflow_experiment_name": "drop-in",
        "mlflow_run_name": "drop-in", "exporters": {"mlflow": {"log_traces": True}},
    }  # fmt: skip
    assert [e.name for e in nemo_gym.setup_exporters(config)] == ["mlflow"]
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    out.with_name("eval_failures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in failed))
    nemo_gym.export_rollouts(records[:10] + failed + records[10:])  # completion order, failures among them
    nemo_gym.teardown_exporters()
    exp = experiment_id(client, "drop-in")
    assert exp is not None
    infos = trace_infos(client, exp)
    assert len(infos) == len(records) + len(failed)
    assert sum(t.info.state.value == "ERROR" for t in infos) == len(failed)
    write_aggregate(out)
    [result] = export_run(out, mlflow_cfg(server.uri, "drop-in"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    again = trace_infos(client, exp)
    assert sorted(t.info.trace_id for t in again) == sorted(t.info.trace_id for t in infos)
    assert len(client.search_runs([exp])) == 1
