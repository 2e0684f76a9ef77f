"""MLflow rollout traces (``exporters.mlflow.log_traces``) through MLflow's public ingestion (OTLP
``/v1/traces`` + ``start_trace``), read back with MlflowClient.search_traces from a real server and
from a SQLite store."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.rollout_spans import conversation_first
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
CANARY = "sk-traces-canary-8d1f0b"


def traces_cfg(uri: str, experiment: str = "traces") -> Any:
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": experiment, "log_traces": True}
    return OmegaConf.create({"exporters": {"mlflow": section}})


def all_traces(client: MlflowClient, experiment_id: str, run_id: str | None = None, spans: bool = True) -> list[Any]:
    traces: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, max_results=100, page_token=token, include_spans=spans
        )
        traces.extend(page)
        token = page.token
        if not token:
            return traces


def fixture_run(tmp_path: Path, name: str = "with-failures") -> Path:
    target = tmp_path / "runs" / name
    shutil.copytree(NEMO_GYM_FIXTURES / name, target)
    for p in [target, *target.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return target / "rollouts.jsonl"


def assert_one_trace_per_rollout(client: MlflowClient, run_id: str, rollouts: Path) -> list[Any]:
    """Every scored rollout once (by row) with its request, reward and spans; failures as ERROR."""
    experiment_id = client.get_run(run_id).info.experiment_id
    traces = all_traces(client, experiment_id, run_id)
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    failures = RunArtifacts.from_path(rollouts).failures_fpath
    failed = failures.read_text().splitlines() if failures.is_file() else []
    scored = {int(t.info.tags["gym_artifacts.row"]): t for t in traces if t.info.state.value == "OK"}
    errors = [t for t in traces if t.info.state.value == "ERROR"]
    assert len(traces) == len(records) + len(failed)  # every rollout once, none twice
    assert sorted(scored) == list(range(len(records))) and len(errors) == len(failed)
    for row, record in enumerate(records):
        trace = scored[row]
        assert trace.info.request_metadata["mlflow.sourceRun"] == run_id
        [reward] = [a for a in trace.info.assessments if a.name == "reward"]
        assert reward.value == record["reward"] and reward.source.source_type == "CODE"
        assert json.loads(trace.data.request) == conversation_first(record["responses_create_params"])
        assert trace.info.tags["gym_artifacts.agent"] == record["agent_ref"]["name"]
        assert trace.info.request_time == int(record["response"]["created_at"] * 1000)
    return traces


@pytest.mark.slow
def test_with_failures_fixture_reads_back_from_a_real_server(mlflow_server: Any, tmp_path: Path) -> None:
    """NeMo Gym 0.7.0's real run with 2 failed rollouts: 10 traces (2 ERROR with the failure's
    message), a TOOL span with its arguments and result for every function call, token usage on
    the LLM spans equal to each Response's usage, the rollout's own start, task and repeat."""
    rollouts = fixture_run(tmp_path)
    [result] = export_run(rollouts, traces_cfg(mlflow_server.uri, "with-failures"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(mlflow_server.uri)
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, rollouts)
    assert len(traces) == 10
    assert_run_views(client, result.backend_run_id, rollouts)
    failures = [json.loads(line) for line in rollouts.with_name("rollouts_failures.jsonl").read_text().splitlines()]
    errors = [t for t in traces if t.info.state.value == "ERROR"]
    assert sorted(t.info.tags["gym_artifacts.repeat"] for t in errors) == ["0", "1"]
    for trace in errors:
        [root] = trace.data.spans
        assert root.status.status_code.value == "ERROR"
        assert failures[0]["_ng_failure_message"] in root.status.description
        assert trace.info.tags["gym_artifacts.task"] == "4"
        assert trace.info.tags["gym_artifacts.failure_class"] == "agent_run_error"
        assert root.inputs["input"][-1]["content"]  # the planned input of the failed rollout
    records = {(r["_ng_task_index"], r["_ng_rollout_index"]): r
               for r in map(json.loads, rollouts.read_text().splitlines())}  # fmt: skip
    for trace in (t for t in traces if t.info.state.value == "OK"):
        record = records[int(trace.info.tags["gym_artifacts.task"]), int(trace.info.tags["gym_artifacts.repeat"])]
        output = record["response"]["output"]
        calls = [i for i in output if i["type"] == "function_call"]
        results = {i["call_id"]: json.loads(i["output"]) for i in output if i["type"] == "function_call_output"}
        tools = [s for s in trace.data.spans if s.span_type == "TOOL"]
        assert [(s.name, s.inputs, s.outputs) for s in tools] == [
            (c["name"], json.loads(c["arguments"]), results[c["call_id"]]) for c in calls
        ]
        llms = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        usage = [s.attributes.get("mlflow.chat.tokenUsage") for s in llms]
        summed = {k: sum(u[k] for u in usage if u) for k in ("input_tokens", "output_tokens", "total_tokens")}
        assert summed == {k: record["response"]["usage"][k] for k in summed}
        assert trace.info.token_usage == summed
        root = next(s for s in trace.data.spans if s.parent_id is None)
        assert root.span_type == "AGENT" and root.start_time_ns == int(record["response"]["created_at"] * 1e9)
        assert all(s.parent_id == root.span_id for s in trace.data.spans if s is not root)


@pytest.mark.slow
def test_traces_read_back_linked_to_the_run(
    quickstart_run: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways in (a server's /v1/traces; a SQLite store through MLflow's own server started for
    the export) hold the same traces; the config's secret is masked everywhere; a second export
    is skipped by its receipt."""
    monkeypatch.setenv("POLICY_API_KEY", CANARY)
    [result] = export_run(quickstart_run, traces_cfg(tracking_uri, f"quickstart-{tracking_uri[:4]}"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(tracking_uri)
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)
    attributes = next(s for s in traces[0].data.spans if s.parent_id is None).attributes
    assert attributes["gym._ng_environment_server"]  # the rollout's other fields ride along
    run = client.get_run(result.backend_run_id)
    assert run.data.params["policy_api_key"] == "***"
    assert all(CANARY not in json.dumps(t.to_dict()) for t in traces)
    [again] = export_run(quickstart_run, traces_cfg(tracking_uri, f"quickstart-{tracking_uri[:4]}"))
    assert again.status is ExportStatus.SKIPPED
    assert len(all_traces(client, run.info.experiment_id, result.backend_run_id)) == 300


def assert_run_views(client: MlflowClient, run_id: str, rollouts: Path) -> None:
    """The planned inputs as the run's dataset input, the headline as its description, the
    HTML report as an artifact, and the run's times from the eval's files."""
    run = client.get_run(run_id)
    headline, traces = run.data.tags["mlflow.note.content"].split("\n\n")
    assert headline == "mean reward 0.5 · 8 of 10 planned rollouts scored (2 failed) - partial"
    # the traces' own window in the experiment's Traces view (the default shows the last 7 days)
    # (every Response of the fixture was created at 2026-11-30T23:36:56Z: the minute around it)
    window = "startTimeLabel=CUSTOM&startTime=2026-11-30T23:36:00.000Z&endTime=2026-11-30T23:37:00.000Z"
    link = f"[10 traces](#/experiments/{run.info.experiment_id}/traces?{window})"
    assert traces.startswith(f"Traces: {link}, from 2026-11-30 ("), traces
    [dataset_input] = run.inputs.dataset_inputs
    assert json.loads(dataset_input.dataset.profile) == {"num_rows": 10}
    assert dataset_input.dataset.name.endswith("planned inputs")
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", "eval")]
    report = Path(client.download_artifacts(run_id, "report.html", str(rollouts.parent.parent / "dl")))
    page = report.read_text()
    assert "<html" in page.lower() and "get_weather" in page
    assert run.info.end_time >= run.info.start_time


KILLER = """
import os, signal, sys
from gym_artifacts._builtin_exporters import _mlflow_traces as t
from gym_artifacts._builtin_exporters._mlflow_client import ScopedMlflow
t.BATCH = {batch}
real = ScopedMlflow.post_otlp
calls = []
def post_then_die(self, experiment_id, body):
    calls.append(1)
    if len(calls) == {kill_at}:  # this batch's trace infos are in, its spans are not
        {before_kill}
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, experiment_id, body)
ScopedMlflow.post_otlp = post_then_die
from gym_artifacts.cli import main
sys.exit(main(["export", {rollouts!r}, "-e", "mlflow", "exporters.mlflow.tracking_uri={uri}",
               "exporters.mlflow.experiment_name={experiment}", "exporters.mlflow.log_traces=true"]))
"""


def killed_export(rollouts: Path, uri: str, experiment: str, before_kill: str = "pass") -> None:
    script = KILLER.format(batch=100, kill_at=3, rollouts=str(rollouts), uri=uri, experiment=experiment,
                           before_kill=before_kill)  # fmt: skip
    proc = run_bounded([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == -9, proc.stderr.decode()[-3000:]
    assert not RunArtifacts.from_path(rollouts).export_done_fpath("mlflow").exists()


@pytest.mark.slow
def test_sigkilled_export_rerun_leaves_no_duplicate_trace_on_a_real_server(
    quickstart_run: Path, mlflow_server: Any
) -> None:
    """Killed with 200 of 300 traces whole and the third batch's trace infos sent without their
    spans (the run exists, no receipt): the rerun finds the run by its identity and sends the
    same ids; every rollout is one trace, with all its spans and one reward."""
    killed_export(quickstart_run, mlflow_server.uri, "killed")
    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("killed")
    # 200 whole, 100 without spans (MLflow's client cannot read those with their spans)
    assert len(all_traces(client, experiment.experiment_id, spans=False)) == 300
    [result] = export_run(quickstart_run, traces_cfg(mlflow_server.uri, "killed"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [result.backend_run_id]
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)
    assert all(len(t.info.assessments) == 1 for t in traces)  # the reward, once
    assert all(len(t.data.spans) >= 2 for t in traces)  # the root and at least one model turn
    assert len(all_traces(client, experiment.experiment_id)) == 300


@pytest.mark.slow
def test_sigkilled_sqlite_export_leaves_no_server_and_no_duplicate(quickstart_run: Path, tmp_path: Path) -> None:
    """A SQLite store's export runs MLflow's own server for its duration: killed mid-way, the
    export takes that server with it (its port stops answering); the rerun completes the traces
    exactly once."""
    uri = mlflow_sqlite(tmp_path / 'm.db')
    port_file = tmp_path / "port"
    killed_export(quickstart_run, uri, "traces", before_kill=f"open({str(port_file)!r}, 'w').write(self.tracking_uri)")
    server_url = port_file.read_text()
    assert server_url.startswith("http://127.0.0.1:")
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{server_url}/health", timeout=1)
        except OSError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the export's mlflow server outlived the killed export")
    [result] = export_run(quickstart_run, traces_cfg(uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(uri)
    traces = assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)
    assert all(len(t.info.assessments) == 1 for t in traces)


@pytest.mark.slow
def test_spans_only_traces_carry_verdicts_as_tags(mlflow_server: Any, tmp_path: Path) -> None:
    """``trace_assessments=false``: no start_trace; the spans alone make each trace, with the
    rollout's times, its state, its tags and its verdicts (as tags), linked to the run."""
    rollouts = fixture_run(tmp_path)
    cfg = traces_cfg(mlflow_server.uri, "spans-only")
    cfg.exporters.mlflow.trace_assessments = False
    [result] = export_run(rollouts, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(mlflow_server.uri)
    experiment_id = client.get_run(result.backend_run_id).info.experiment_id
    traces = all_traces(client, experiment_id, result.backend_run_id)
    assert len(traces) == 10 and sum(t.info.state.value == "ERROR" for t in traces) == 2
    records = {str(i): r for i, r in enumerate(map(json.loads, rollouts.read_text().splitlines()))}
    for trace in (t for t in traces if t.info.state.value == "OK"):
        record = records[trace.info.tags["gym_artifacts.row"]]
        assert float(trace.info.tags["gym_artifacts.reward"]) == record["reward"]
        assert trace.info.request_time == int(record["response"]["created_at"] * 1000)
        assert trace.info.token_usage["total_tokens"] == record["response"]["usage"]["total_tokens"]
        assert not trace.info.assessments


def servers_on(name: str) -> list[int]:
    """Pids of live processes whose command line names ``name`` (a server started for a store)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if name in cmdline and str(os.getpid()) != proc.name:
            pids.append(int(proc.name))
    return pids


NEVER_READY = """
import json, sys, time
from gym_artifacts._builtin_exporters import _mlflow_trace_server as server
# a server that never answers its health check (as a wedged start would): it only sleeps
server._mlflow_command = lambda store_uri, port, artifacts: [sys.executable, "-c", "import time; time.sleep(600)", {marker!r}]
from omegaconf import OmegaConf
from gym_artifacts import export_run
cfg = OmegaConf.create({{"exporters": {{"mlflow": {{"enabled": True, "tracking_uri": {uri!r}, "log_traces": True,
                                              "export_deadline": {deadline}}}}}}})
started = time.monotonic()
[result] = export_run({rollouts!r}, cfg)
print(json.dumps({{"status": result.status.value, "reason": result.reason, "seconds": time.monotonic() - started}}))
"""


@pytest.mark.slow
def test_a_sqlite_stores_trace_server_is_under_the_export_deadline(quickstart_run: Path, tmp_path: Path) -> None:
    """A database store's traces go through MLflow's own server, started for the export (10-60 s
    on these machines, up to START_TIMEOUT_S): that start and the traces' requests are bounded by
    ``export_deadline`` like a server store's. A start that never becomes ready ends the export
    FAILED at the deadline, naming it, with no receipt and no server left; the rerun completes the
    same MLflow run, one trace per rollout."""
    from gym_artifacts._builtin_exporters._mlflow_trace_server import START_TIMEOUT_S

    store = tmp_path / "m.db"
    marker = f"never-ready-{tmp_path.name}"
    script = NEVER_READY.format(marker=marker, uri=f"sqlite:///{store}", deadline=15, rollouts=str(quickstart_run))
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S - 30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.splitlines()[-1])
    assert failed["status"] == "FAILED" and "deadline" in failed["reason"], failed
    assert failed["seconds"] < START_TIMEOUT_S / 3, failed  # the deadline, not the start timeout
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("mlflow").exists()
    assert servers_on(marker) == []  # the guard took the never-ready server with it
    [result] = export_run(quickstart_run, traces_cfg(f"sqlite:///{store}"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("traces")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [result.backend_run_id]
    assert_one_trace_per_rollout(client, result.backend_run_id, quickstart_run)


@pytest.mark.slow
def test_a_sqlite_store_gets_the_evaluation_dataset_once(tmp_path: Path) -> None:
    """A database store with no server (the embedded default) gets the planned inputs as an
    evaluation dataset of the experiment too (MLflow's Datasets page), through MLflow's own store
    calls: 10 records for the fixture's 10 planned rollouts, and an export of the same run after
    its receipt is gone (found by identity) upserts them again without adding any."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    rollouts = fixture_run(tmp_path)
    uri = mlflow_sqlite(tmp_path / 'm.db')
    cfg = OmegaConf.create({"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri,
                                                     "experiment_name": "datasets"}}})  # fmt: skip
    [result] = export_run(rollouts, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    RunArtifacts.from_path(rollouts).export_done_fpath("mlflow").unlink()
    [again] = export_run(rollouts, cfg)
    assert again.backend_run_id == result.backend_run_id
    client = MlflowClient(uri)
    experiment_id = client.get_run(result.backend_run_id).info.experiment_id
    [dataset] = client.search_datasets([experiment_id])
    assert dataset.name.endswith("planned inputs")
    store = SqlAlchemyStore(uri, str(tmp_path / "artifacts"))
    records, _ = store._load_dataset_records(dataset.dataset_id)
    planned = [json.loads(line) for line in rollouts.with_name("rollouts_materialized_inputs.jsonl").read_text().splitlines()]
    assert sorted(json.dumps(r.inputs, sort_keys=True) for r in records) == sorted(
        json.dumps(p, sort_keys=True) for p in planned
    )


def test_a_trace_export_reports_its_traces_on_the_progress_line(mlflow_server: Any, tmp_path: Path) -> None:
    """An hour-long trace export must not look hung: the progress callback gets ``traces to
    mlflow`` with the traces handed to the backend so far, rising, ending at every rollout of the
    run (8 scored + 2 failed), and the progress line counts them as traces."""
    import io

    from gym_artifacts.core.progress import Progress

    rollouts = fixture_run(tmp_path)
    calls: list[tuple[str, int, int]] = []
    [result] = export_run(rollouts, traces_cfg(mlflow_server.uri, "progress"),
                          progress=lambda *call: calls.append(call))  # fmt: skip
    assert result.status is ExportStatus.EXPORTED, result.reason
    traced = [(done, total) for label, done, total in calls if label == "traces to mlflow"]
    assert traced and traced[-1] == (10, 10), calls
    assert [d for d, _ in traced] == sorted(d for d, _ in traced)
    stream = io.StringIO()
    line = Progress(stream=stream, enabled=True)
    line.MIN_INTERVAL_S = 0
    line.update("traces to mlflow", 4, 10)
    line.close()
    assert "4/10" in stream.getvalue() and "trace" in stream.getvalue()


# any two trace starts (ms) from 1970 to 2200, and any moment someone looks
@given(st.integers(0, 7_258_118_400_000), st.integers(0, 10**11), st.integers(0, 7_258_118_400_000))
def test_the_traces_link_covers_every_trace_and_the_note_comes_with_mlflows_default_view(
    first_ms: int, span_ms: int, now_ms: int
) -> None:
    """The run description's link names a CUSTOM range holding the first and the last trace's
    start (MLflow filters on the start; a range of whole minutes); the result notes the link
    exactly when some traces start before MLflow's default 'Last 7 days'."""
    import datetime as dt
    from urllib.parse import parse_qs, urlsplit

    from gym_artifacts._builtin_exporters._mlflow_trace_view import TraceWindow

    window = TraceWindow(3, first_ms, first_ms + span_ms)
    path = window.path("7")
    assert path.startswith("#/experiments/7/traces?")
    query = parse_qs(urlsplit(path[1:]).query)
    assert query["startTimeLabel"] == ["CUSTOM"]

    def ms(value: str) -> int:
        return int(dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.000Z").replace(tzinfo=dt.timezone.utc).timestamp() * 1000)

    start, end = ms(query["startTime"][0]), ms(query["endTime"][0])
    assert start <= window.first_ms and window.last_ms < end and start % 60_000 == end % 60_000 == 0
    note = window.note("7", now_s=now_ms / 1000)
    assert (note is not None) == (first_ms < now_ms - 7 * 86_400_000)
    assert note is None or (path in note and "Last 7 days" in note)
