"""The Phoenix backend against a real ``phoenix serve`` on 127.0.0.1 (SQLite working directory),
read back through Phoenix's own client."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("phoenix.client")

from phoenix.client import Client

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.phoenix import PhoenixExporter
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.phoenix_server import PhoenixServer
from tests.processes import run_bounded
from tests.test_report import browser  # noqa: F401 - the shared Chromium fixture

REPO = Path(__file__).resolve().parent.parent
CANARY = "sk-phoenix-canary-2b7e40"
pytestmark = pytest.mark.slow


@pytest.fixture
def phoenix(phoenix_server: PhoenixServer) -> PhoenixServer:
    """The session's server (conftest.py), shared with the contract suite."""
    return phoenix_server


def px_cfg(url: str, dataset: str) -> Any:
    section = {"enabled": True, "base_url": url, "dataset_name": dataset}
    return OmegaConf.create({"exporters": {"phoenix": section}})


def assert_read_back_once(url: str, experiment_id: str, dataset: str, quickstart_run: Path) -> None:
    client = Client(base_url=url)
    records = [json.loads(line) for line in quickstart_run.read_text().splitlines()]
    ds = client.datasets.get_dataset(dataset=dataset)
    assert len(ds.examples) == len({r["_ng_task_index"] for r in records})  # one example per task
    example_task = {e["id"]: e["metadata"]["task"] for e in ds.examples}
    experiment = client.experiments.get_experiment(experiment_id=experiment_id)
    runs = experiment["task_runs"]
    keys = {(example_task[r["dataset_example_id"]], r["repetition_number"]) for r in runs}
    assert len(runs) == len(keys) == len(records)  # every rollout once
    by_key = {(example_task[r["dataset_example_id"]], r["repetition_number"]): r for r in runs}
    rewards = {
        e.experiment_run_id: e.result["score"] for e in experiment["evaluation_runs"] if e.name == "reward"
    }
    assert len(rewards) == len(records)
    assert sum(e.name == "reward" for e in experiment["evaluation_runs"]) == len(records)  # none twice
    for record in records:
        run = by_key[(str(record["_ng_task_index"]), record["_ng_rollout_index"] + 1)]
        assert run["output"] == record["response"]
        assert rewards[run["id"]] == record["reward"]
    meta = client.experiments.get(experiment_id=experiment_id)["metadata"]
    assert meta["config"]["policy_api_key"] == "***"
    assert meta["coverage"]["coverage/expected"] == meta["coverage"]["coverage/scored"] == 300  # read back


def test_export_reads_back_and_skips_second_time(
    quickstart_run: Path, phoenix: PhoenixServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLICY_API_KEY", CANARY)
    [result] = export_run(quickstart_run, px_cfg(phoenix.url, "quickstart-a"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert_read_back_once(phoenix.url, result.backend_run_id, "quickstart-a", quickstart_run)
    db = b"".join(p.read_bytes() for p in phoenix.root.rglob("*.db*") if p.is_file())
    assert CANARY.encode() not in db
    [again] = export_run(quickstart_run, px_cfg(phoenix.url, "quickstart-a"))
    assert again.status is ExportStatus.SKIPPED


def test_sigkilled_export_rerun_leaves_no_duplicate(quickstart_run: Path, phoenix: PhoenixServer) -> None:
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from phoenix.client.resources.experiments import Experiments
        real, calls = Experiments.log_run, []
        def log_run(self, **kw):
            calls.append(1)
            if len(calls) == 120:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, **kw)
        Experiments.log_run = log_run
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "phoenix",
                       "exporters.phoenix.base_url={phoenix.url}", "exporters.phoenix.dataset_name=quickstart-b"]))
        """
    )
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("phoenix").exists()
    [result] = export_run(quickstart_run, px_cfg(phoenix.url, "quickstart-b"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = Client(base_url=phoenix.url)
    dataset = client.datasets.get_dataset(dataset="quickstart-b")
    assert len(client.experiments.list(dataset_id=dataset.id)) == 1
    assert_read_back_once(phoenix.url, result.backend_run_id, "quickstart-b", quickstart_run)


def test_two_destinations_get_one_experiment_each_and_skip_without_contact(
    quickstart_run: Path, phoenix: PhoenixServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two datasets on one server are two destinations: an experiment (and receipt) for each;
    re-exports to either skip without building a client."""
    first = {}
    for dataset in ("quickstart-c", "quickstart-d"):
        [result] = export_run(quickstart_run, px_cfg(phoenix.url, dataset))
        assert result.status is ExportStatus.EXPORTED, result.reason
        assert_read_back_once(phoenix.url, result.backend_run_id, dataset, quickstart_run)
        first[dataset] = result.backend_run_id
    assert len(set(first.values())) == 2
    receipts = read_receipts(RunArtifacts.from_path(quickstart_run).export_done_fpath("phoenix"))
    assert sorted(r.destination["dataset_name"] for r in receipts) == ["quickstart-c", "quickstart-d"]

    def no_contact(self: PhoenixExporter) -> None:
        raise AssertionError("a skipped export contacted Phoenix")

    monkeypatch.setattr(PhoenixExporter, "_client", no_contact)
    for dataset, experiment_id in first.items():
        [again] = export_run(quickstart_run, px_cfg(phoenix.url, dataset))
        assert again.status is ExportStatus.SKIPPED, again.reason
        assert again.backend_run_id == experiment_id


def _utc(value: Any) -> Any:
    import datetime as dt

    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def test_runs_and_evaluations_carry_the_rollouts_own_times(quickstart_run: Path, phoenix: PhoenixServer) -> None:
    """Each experiment run starts and ends at its rollout's own time (the response's
    ``created_at``), and its evaluations are dated at the rollout's end: never 1970."""
    import datetime as dt

    [result] = export_run(quickstart_run, px_cfg(phoenix.url, "quickstart-times"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = Client(base_url=phoenix.url)
    example_task = {e["id"]: e["metadata"]["task"] for e in client.datasets.get_dataset(dataset="quickstart-times").examples}
    experiment = client.experiments.get_experiment(experiment_id=result.backend_run_id)
    runs = {(example_task[r["dataset_example_id"]], r["repetition_number"]): r for r in experiment["task_runs"]}
    evaluations = {e.experiment_run_id: e for e in experiment["evaluation_runs"] if e.name == "reward"}
    records = [json.loads(line) for line in quickstart_run.read_text().splitlines()]
    assert len(runs) == len(evaluations) == len(records)
    for record in records:
        own = dt.datetime.fromtimestamp(record["response"]["created_at"], dt.timezone.utc)
        run = runs[(str(record["_ng_task_index"]), record["_ng_rollout_index"] + 1)]
        assert _utc(run["start_time"]) == own, (run["start_time"], own)
        assert _utc(run["end_time"]) == own, (run["end_time"], own)
        evaluation = evaluations[run["id"]]
        assert _utc(evaluation.start_time) == _utc(evaluation.end_time) == own, evaluation


def all_spans(client: Client, project: str) -> list[Any]:
    spans: list[Any] = []
    while True:  # the client pages by time: ask until no new span comes
        page = client.spans.get_spans(project_identifier=project, limit=10_000)
        if len(page) == len(spans):
            return spans
        spans = page


def trace_annotations(client: Client, project: str) -> list[dict[str, Any]]:
    """Every trace annotation the export made in ``project`` (identifier ``gym-artifacts``)."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"identifier": "gym-artifacts", "limit": 1000}
        if cursor:
            params["cursor"] = cursor
        response = client._client.get(f"v1/projects/{project}/trace_annotations", params=params)
        response.raise_for_status()
        body = response.json()
        found.extend(body["data"])
        cursor = body.get("next_cursor")
        if not cursor:
            return found


def test_with_failures_fixture_as_traces(phoenix: PhoenixServer, tmp_path: Path) -> None:
    """NeMo Gym 0.7.0's real run with 2 failed rollouts as Phoenix traces (OpenInference): 10
    root spans, the 2 failed ones ERROR with the failure's message, a TOOL span with its
    arguments for every function call, LLM token counts equal to each Response's usage, and
    one reward annotation per scored rollout."""
    from tests.test_mlflow_traces import fixture_run

    rollouts = fixture_run(tmp_path)
    section = {"enabled": True, "base_url": phoenix.url, "project_name": "with-failures-traces",
               "log_experiment": False}  # fmt: skip
    calls: list[tuple[str, int, int]] = []
    [result] = export_run(rollouts, OmegaConf.create({"exporters": {"phoenix": section}}),
                          progress=lambda *call: calls.append(call))  # fmt: skip
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert [c for c in calls if c[0] == "traces to phoenix"][-1] == ("traces to phoenix", 10, 10)
    client = Client(base_url=phoenix.url)
    spans = all_spans(client, "with-failures-traces")
    roots = [s for s in spans if not s.get("parent_id")]
    assert len(roots) == 10 and len({s["context"]["trace_id"] for s in spans}) == 10
    failures = [json.loads(line) for line in rollouts.with_name("rollouts_failures.jsonl").read_text().splitlines()]
    errors = [s for s in roots if s["status_code"] == "ERROR"]
    assert len(errors) == 2 and all(failures[0]["_ng_failure_message"] in s["status_message"] for s in errors)
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    calls = [i for r in records for i in r["response"]["output"] if i["type"] == "function_call"]
    tools = [s for s in spans if s["span_kind"] == "TOOL"]
    assert sorted(json.loads(s["attributes"]["input.value"])["city"] for s in tools) == sorted(
        json.loads(c["arguments"])["city"] for c in calls
    )
    llms = [s for s in spans if s["span_kind"] == "LLM"]
    total = sum(s["attributes"].get("llm.token_count.total", 0) for s in llms)
    assert total == sum(r["response"]["usage"]["total_tokens"] for r in records)
    annotations = trace_annotations(client, "with-failures-traces")  # Phoenix's trace annotation scores
    assert sorted(a["result"]["score"] for a in annotations) == sorted(r["reward"] for r in records)


def test_sigkilled_traces_export_rerun_leaves_no_duplicate(quickstart_run: Path, phoenix: PhoenixServer) -> None:
    """Killed after the first batch of traces went out: the rerun sends the same span ids and
    Phoenix holds every rollout once, with one reward annotation each."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import _phoenix_traces as t
        t.BATCH = 100
        real, calls = t.export_request, []
        def request_then_die(*args):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args)
        t.export_request = request_then_die
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "phoenix", "exporters.phoenix.base_url={phoenix.url}",
                       "exporters.phoenix.project_name=killed-traces", "exporters.phoenix.log_experiment=false"]))
        """
    )
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("phoenix").exists()
    section = {"enabled": True, "base_url": phoenix.url, "project_name": "killed-traces", "log_experiment": False}
    [result] = export_run(quickstart_run, OmegaConf.create({"exporters": {"phoenix": section}}))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = Client(base_url=phoenix.url)
    spans = all_spans(client, "killed-traces")
    roots = [s for s in spans if not s.get("parent_id")]
    assert len(roots) == len({s["context"]["trace_id"] for s in roots}) == 300
    assert len(trace_annotations(client, "killed-traces")) == 300


def test_a_traces_export_longer_than_its_deadlines_lands_while_batches_keep_landing(
    quickstart_run: Path, phoenix: PhoenixServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 rollouts in batches of 20, each post held 2 s: the export runs about twice its
    ``export_deadline`` and ``traces_landed_timeout`` (15 s each), yet every batch is stored and
    annotated within them, so every trace lands (both bound a stall, not the batches' number)."""
    import time

    from gym_artifacts._builtin_exporters import _phoenix_traces

    real = _phoenix_traces.export_request

    def slow_request(*args: Any) -> bytes:
        time.sleep(2.0)
        return real(*args)

    monkeypatch.setattr(_phoenix_traces, "BATCH", 20)
    monkeypatch.setattr(_phoenix_traces, "export_request", slow_request)
    section = {"enabled": True, "base_url": phoenix.url, "project_name": "long-traces", "log_experiment": False,
               "export_deadline": 15, "traces_landed_timeout": 15}  # fmt: skip
    start = time.monotonic()
    [result] = export_run(quickstart_run, OmegaConf.create({"exporters": {"phoenix": section}}))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert time.monotonic() - start > 15 * 1.5
    roots = [s for s in all_spans(Client(base_url=phoenix.url), "long-traces") if not s.get("parent_id")]
    assert len(roots) == 300


# -- what Phoenix shows of a NeMo Gym run (issue 39): names from the run (agent, run name, date), every
# planned rollout an experiment run (failed ones as ERROR runs) linked to its trace, reward and
# verdicts as trace annotations, readable root input/output, OpenInference tool lists on model calls
AGENT = "example_single_tool_call_simple_agent"


def _copy_fixture(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(NEMO_GYM_FIXTURES / name, target)
    return target / "rollouts.jsonl"


def _export_default(run: Path, url: str) -> Any:
    cfg = OmegaConf.create({"exporters": {"phoenix": {"enabled": True, "base_url": url}}})
    [result] = export_run(run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    return result


def test_phoenix_names_runs_errors_links_and_annotations(phoenix: PhoenixServer, tmp_path: Path) -> None:
    url = phoenix.url
    client = Client(base_url=url)
    failing, clean = _copy_fixture("with-failures", tmp_path), _copy_fixture("clean", tmp_path)
    created = min(json.loads(line)["response"]["created_at"] for line in failing.read_text().splitlines())
    day = dt.datetime.fromtimestamp(created, dt.timezone.utc).date().isoformat()
    first = _export_default(failing, url)
    experiment = client.experiments.get_experiment(experiment_id=first.backend_run_id)
    info = client.experiments.get(experiment_id=first.backend_run_id)
    datasets = {d["name"] for d in client.datasets.list()}
    projects = {p["name"] for p in client.projects.list()}
    # named from the run: agent, run name (folder), date
    named = [n for n in datasets if "with-failures" in n]
    assert len(named) == 1 and AGENT in named[0] and day in named[0], datasets
    project = named[0]  # traces go to the project of the dataset's name
    assert project in projects, projects
    assert "with-failures" in info["name"] and not info["name"].startswith("rollouts")
    # every planned rollout: 10 runs, the 2 failed ones as ERROR runs with their failure
    runs = experiment["task_runs"]
    assert len(runs) == 10
    errors = [r for r in runs if r.get("error")]
    assert len(errors) == 2 and all("ClientResponseError" in r["error"] for r in errors)
    # each linked to its trace, which is in the project
    spans = all_spans(client, project)
    roots = {s["context"]["trace_id"]: s for s in spans if not s.get("parent_id")}
    assert len(roots) == 10 and {r["trace_id"] for r in runs} == set(roots)
    # reward as a trace annotation of every scored rollout
    rewards = [a for a in trace_annotations(client, project) if a["name"] == "reward"]
    assert len(rewards) == 8 and {a["result"]["score"] for a in rewards} == {0.0, 1.0}
    # the root's input and output are what a person reads: the last user turn, the final answer
    ok_roots = [s for s in roots.values() if s["status_code"] != "ERROR"]
    assert all(not s["attributes"]["input.value"].startswith("{") for s in ok_roots)
    assert {s["attributes"]["input.value"] for s in ok_roots} <= {
        "what's it like in sf?", "humidity in sf", "going out in sf tonight", "sf weather?", "hello",
    } or len({s["attributes"]["input.value"] for s in ok_roots}) > 1  # fmt: skip
    # a model call carries the tools offered (OpenInference llm.tools)
    llms = [s for s in spans if s["span_kind"] == "LLM"]
    def tools_of(span: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in span["attributes"].items() if k.startswith("llm.tools")})

    assert llms and all("get_weather" in tools_of(s) for s in llms)
    # a second run: a second, distinct name
    _export_default(clean, url)
    again = {p["name"] for p in client.projects.list()}
    assert len([p for p in again if AGENT in p]) == 2
    assert any("clean" in p for p in again)



def test_phoenix_ui_shows_named_runs_errors_and_trace_annotations(
    phoenix: PhoenixServer, browser: Any, tmp_path: Path  # noqa: F811
) -> None:
    """Phoenix's own UI (Chromium) on the exported with-failures run: the project named from the
    run, its 10 traces (2 errors), the experiment's 10 runs; screenshots in test-artifacts/."""
    import datetime as dt
    import time
    from urllib.parse import urlencode

    from tests.test_report import SCREENSHOTS

    run = _copy_fixture("with-failures", tmp_path)
    result = _export_default(run, phoenix.url)
    client = Client(base_url=phoenix.url)
    info = client.experiments.get(experiment_id=result.backend_run_id)
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1600, "height": 950})

    def shown(needle: str, times: int = 1) -> str:
        deadline = time.monotonic() + 60
        while True:
            text = str(page.inner_text("body"))
            if text.count(needle) >= times or time.monotonic() > deadline:
                return text
            time.sleep(0.5)

    page.goto(f"{phoenix.url}/projects")
    text = shown(info["name"][:30])
    for _ in range(20):  # the session's server holds other tests' projects: the list pages them
        more = page.get_by_text("Load More")
        if info["name"][:30] in text or not more.count():
            break
        more.first.click()
        text = shown(info["name"][:30])
    page.screenshot(path=str(SCREENSHOTS / "phoenix-projects.png"))
    assert info["name"][:30] in text  # the project, named from the run
    # Its traces, opened as a user opens an older eval's: the project's page over the eval's own
    # window (Phoenix shows the last 7 days by default; the spans keep the rollouts' real times).
    [project_id] = [p["id"] for p in client.projects.list() if p["name"] == info["name"]]
    starts = sorted(s["start_time"] for s in client.spans.get_spans(project_identifier=info["name"], limit=1000))
    hour = dt.timedelta(hours=1)
    window = {"timeRangeStart": (dt.datetime.fromisoformat(starts[0]) - hour).isoformat(),
              "timeRangeEnd": (dt.datetime.fromisoformat(starts[-1]) + hour).isoformat()}  # fmt: skip
    page.goto(f"{phoenix.url}/projects/{project_id}?{urlencode(window)}")
    shown("what's it like in sf?")
    text = shown("TRACE ANNOTATIONS")
    page.screenshot(path=str(SCREENSHOTS / "phoenix-traces.png"))
    # the list's input/output: the last user turn and the final answer, not JSON
    assert "what's it like in sf?" in text and "{" not in text.split("what's it like in sf?")[0][-200:]
    assert re.search(r"Total Traces\s+10\b", text) and text.count("ClientResponseError") >= 2
    assert re.search(r"TRACE ANNOTATIONS\s+reward", text)  # the reward as a trace annotation
    # the experiment's row (a page wide enough for every column): 10 runs, 2 of them errors
    page.set_viewport_size({"width": 3200, "height": 950})
    page.goto(f"{phoenix.url}/datasets/{info['dataset_id']}/experiments")
    text = shown("error rate")
    shown(info["name"][:30], 2)
    page.screenshot(path=str(SCREENSHOTS / "phoenix-experiments.png"))
    table = page.locator("table").last
    header = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    cells = [c.strip() for c in table.locator("tbody tr").first.locator("td").all_inner_texts()]
    row = dict(zip(header, cells, strict=True))
    assert info["name"] in row["name"]  # the experiment, named from the run
    assert (row["run count"], row["error rate"], row["reward"]) == ("10", "20.00%", "0.50"), row
    # a second run: its own project, under a second, distinct name, beside the first
    clean = Client(base_url=phoenix.url).experiments.get(
        experiment_id=_export_default(_copy_fixture("clean", tmp_path), phoenix.url).backend_run_id
    )
    assert clean["name"] != info["name"]
    page.set_viewport_size({"width": 1600, "height": 950})
    page.goto(f"{phoenix.url}/projects")
    names = [info["name"], clean["name"]]  # whole (a card shows their first ~22 characters)
    text = shown(names[1])
    for _ in range(20):  # the session's server holds other tests' projects: the list pages them
        more = page.get_by_text("Load More")
        if all(n in text for n in names) or not more.count():
            break
        more.first.click()
        text = shown(names[1])
    page.screenshot(path=str(SCREENSHOTS / "phoenix-two-runs.png"))
    assert all(n in text for n in names), names
    page.close()
