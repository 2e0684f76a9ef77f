"""The LangSmith backend: the real ``langsmith`` client against a local endpoint answering as
LangSmith's API does (tests/langsmith_api.py); asserts on what the client sent and reads back
through the same client."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("langsmith")

from langsmith import Client

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts
from gym_artifacts.run.rollout_spans import conversation_first, without_nulls
from tests.langsmith_api import LangsmithApi
from tests.processes import run_bounded

# The client's older read methods (list_runs, list_feedback) warn of a migration; they still
# speak the documented REST endpoints this local endpoint answers.
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated and will be removed after")
REPO = Path(__file__).resolve().parent.parent
POLICY_CANARY = "sk-policy-canary-langsmith-61c2"
API_KEY = "lsv2_pt_canary-key-0d93"


@pytest.fixture
def langsmith_api() -> Iterator[LangsmithApi]:
    api = LangsmithApi().start()
    yield api
    api.stop()


def ls_cfg(url: str) -> Any:
    return OmegaConf.create(
        {"exporters": {"langsmith": {"enabled": True, "api_url": url, "api_key": API_KEY}}}
    )


def records(quickstart_run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in quickstart_run.read_text().splitlines()]


def sent_run_ids(api: LangsmithApi) -> list[str]:
    """The root runs (one a rollout) sent, in order."""
    return [
        run["id"]
        for q in api.state.requests
        if q.path == "/runs/batch"
        for run in json.loads(q.body).get("post", [])
        if not run.get("parent_run_id")
    ]


def assert_read_back_once(api: LangsmithApi, project_id: str, quickstart_run: Path) -> None:
    client = Client(api_url=api.url, api_key=API_KEY, auto_batch_tracing=False)
    rows = records(quickstart_run)
    everything = list(client.list_runs(project_id=project_id))
    runs = [r for r in everything if r.parent_run_id is None]
    by_row = {r.extra["metadata"]["row"]: r for r in runs}
    assert len(runs) == len(by_row) == len(rows)  # every rollout once
    children = [r for r in everything if r.parent_run_id is not None]
    calls = sum(1 for r in rows for i in r["response"]["output"] if i["type"] == "function_call")
    assert sum(r.run_type == "tool" for r in children) == calls  # a tool run per function call
    usage = sum(r.outputs["usage_metadata"]["total_tokens"] for r in children if r.run_type == "llm"
                and "usage_metadata" in r.outputs)  # fmt: skip
    assert usage == sum(r["response"]["usage"]["total_tokens"] for r in rows)
    listed = list(client.list_feedback(run_ids=[r.id for r in runs]))
    feedback = {(str(f.run_id), f.key): f.score for f in listed}
    assert len(listed) == len(feedback) == len(rows)  # one reward per rollout, none twice
    project = client.read_project(project_id=project_id)
    examples = list(client.list_examples(dataset_id=project.reference_dataset_id))
    assert len(examples) == len({r["_ng_task_index"] for r in rows})  # one example per task
    example_by_id = {str(e.id): e for e in examples}
    for row, record in enumerate(rows):
        run = by_row[row]
        assert run.inputs == conversation_first(record["responses_create_params"])
        assert run.outputs["output"] == without_nulls(record["response"]["output"])
        assert run.run_type == "chain" and run.start_time.timestamp() == record["response"]["created_at"]
        assert feedback[(str(run.id), "reward")] == record["reward"]
        example = example_by_id[str(run.reference_example_id)]
        assert example.metadata["task"] == str(record["_ng_task_index"])
    assert project.metadata["config"]["policy_api_key"] == "***"


@pytest.mark.slow
def test_export_reads_back_through_the_client(
    quickstart_run: Path, langsmith_api: LangsmithApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLICY_API_KEY", POLICY_CANARY)
    [result] = export_run(quickstart_run, ls_cfg(langsmith_api.url))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.rows == 300
    assert_read_back_once(langsmith_api, result.backend_run_id, quickstart_run)
    # no secret in any request: the config's secret nowhere, the API key only in its header
    for q in langsmith_api.state.requests:
        wire = q.path.encode() + q.body + json.dumps(q.headers).encode()
        assert POLICY_CANARY.encode() not in wire, q.path
        assert API_KEY.encode() not in q.path.encode() + q.body, q.path
        assert {k.lower(): v for k, v in q.headers.items()}.get("x-api-key") == API_KEY
    sent = len(langsmith_api.state.requests)
    [again] = export_run(quickstart_run, ls_cfg(langsmith_api.url))
    assert again.status is ExportStatus.SKIPPED
    assert len(langsmith_api.state.requests) == sent  # nothing contacted


@pytest.mark.slow
def test_sigkilled_export_rerun_sends_the_same_ids_and_duplicates_nothing(
    quickstart_run: Path, langsmith_api: LangsmithApi
) -> None:
    """Killed after the second batch of runs went out, before their feedback: the rerun sends
    every id again, identical, and LangSmith keeps one of each."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import langsmith as ls
        real, calls = ls.LangsmithExporter._feedback, []
        def feedback(client, run_id, r, session_id):
            calls.append(run_id)
            if len(calls) == 150:
                os.kill(os.getpid(), signal.SIGKILL)
            real(client, run_id, r, session_id)
        ls.LangsmithExporter._feedback = staticmethod(feedback)
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "langsmith",
                       "exporters.langsmith.api_url={langsmith_api.url}",
                       "exporters.langsmith.api_key={API_KEY}"]))
        """
    )
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=180)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("langsmith").exists()
    first_attempt = sent_run_ids(langsmith_api)
    assert len(first_attempt) == 200 and len(langsmith_api.state.feedback) == 149
    [result] = export_run(quickstart_run, ls_cfg(langsmith_api.url))
    assert result.status is ExportStatus.EXPORTED, result.reason
    second_attempt = sent_run_ids(langsmith_api)[len(first_attempt) :]
    assert second_attempt[:200] == first_attempt  # stable ids across the retry
    assert len(langsmith_api.state.sessions) == 1 and len(langsmith_api.state.datasets) == 1
    assert_read_back_once(langsmith_api, result.backend_run_id, quickstart_run)


@pytest.mark.slow
def test_refused_runs_fail_the_export_without_a_receipt(
    quickstart_run: Path, langsmith_api: LangsmithApi
) -> None:
    """The client reports a refused batch to a callback instead of raising: it must not pass."""
    langsmith_api.state.refuse_runs = True
    [result] = export_run(quickstart_run, ls_cfg(langsmith_api.url))
    assert result.status is ExportStatus.FAILED
    assert "refused runs" in (result.reason or "")
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("langsmith").exists()


@pytest.mark.slow
def test_two_destinations_get_one_project_each_and_skip_without_contact(quickstart_run: Path) -> None:
    """Two LangSmith endpoints: a project (and receipt) in each; re-exports to either skip and
    send nothing."""
    apis = [LangsmithApi().start(), LangsmithApi().start()]
    try:
        results = [export_run(quickstart_run, ls_cfg(api.url)) for api in apis]
        for [result], api in zip(results, apis, strict=True):
            assert result.status is ExportStatus.EXPORTED, result.reason
            assert len(api.state.sessions) == 1
            assert_read_back_once(api, result.backend_run_id, quickstart_run)
        receipts = read_receipts(RunArtifacts.from_path(quickstart_run).export_done_fpath("langsmith"))
        assert sorted(r.destination["api_url"] for r in receipts) == sorted(api.url for api in apis)
        sent = [len(api.state.requests) for api in apis]
        for api in apis:
            [again] = export_run(quickstart_run, ls_cfg(api.url))
            assert again.status is ExportStatus.SKIPPED, again.reason
        assert [len(api.state.requests) for api in apis] == sent  # nothing contacted
    finally:
        for api in apis:
            api.stop()


def test_with_failures_fixture_as_runs(langsmith_api: LangsmithApi, tmp_path: Path) -> None:
    """NeMo Gym 0.7.0's real run with 2 failed rollouts: 10 root runs (the 2 failed ones with the
    failure's message as their error), a tool run per function call, 8 rewards."""
    from tests.test_mlflow_traces import fixture_run

    rollouts = fixture_run(tmp_path)
    calls: list[tuple[str, int, int]] = []
    [result] = export_run(rollouts, ls_cfg(langsmith_api.url), progress=lambda *call: calls.append(call))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert [c for c in calls if c[0] == "traces to langsmith"][-1] == ("traces to langsmith", 10, 10)
    client = Client(api_url=langsmith_api.url, api_key=API_KEY, auto_batch_tracing=False)
    everything = list(client.list_runs(project_id=result.backend_run_id))
    roots = [r for r in everything if r.parent_run_id is None]
    assert len(roots) == 10
    failures = [json.loads(line) for line in rollouts.with_name("rollouts_failures.jsonl").read_text().splitlines()]
    errors = [r for r in roots if r.error]
    assert len(errors) == 2 and all(failures[0]["_ng_failure_message"] in r.error for r in errors)
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    calls = [i for r in records for i in r["response"]["output"] if i["type"] == "function_call"]
    tools = [r for r in everything if r.run_type == "tool"]
    assert sorted(r.inputs["city"] for r in tools) == sorted(json.loads(c["arguments"])["city"] for c in calls)
    feedback = list(client.list_feedback(run_ids=[r.id for r in roots]))
    assert sorted(f.score for f in feedback) == sorted(r["reward"] for r in records)
