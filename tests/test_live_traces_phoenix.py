"""Live traces in Phoenix: rollouts handed to ``export_rollouts`` during a live run appear as
traces in a real ``phoenix serve`` while the eval runs, and the post-run export adds only what is
missing (issue 40): 200 rollouts over about 20 seconds, traces read back through Phoenix's
client grow (at least half before teardown), all 200 after teardown; after ``export`` still 200
traces in one project, one dataset and one experiment, one reward annotation per trace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("phoenix.client")

from phoenix.client import Client

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live.fanout import live_run
from tests.phoenix_server import PhoenixServer
from tests.test_live_traces import ROLLOUTS, nemo_gym_rollouts, run_eval, write_aggregate
from tests.test_phoenix import trace_annotations

pytestmark = pytest.mark.slow


def root_spans(client: Client, project: str) -> list[Any]:
    """The project's root spans (one per trace); none while the project does not exist yet."""
    import httpx

    try:
        spans = client.spans.get_spans(project_identifier=project, limit=10_000)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            return []
        raise
    return [s for s in spans if not s.get("parent_id")]


def traced(client: Client, project: str, want: int, wait_s: float) -> int:
    """Root spans in the project once ``want`` are there or ``wait_s`` passed (Phoenix stores
    spans in the background)."""
    deadline = time.monotonic() + wait_s
    while True:
        count = len(root_spans(client, project))
        if count >= want or time.monotonic() > deadline:
            return count
        time.sleep(0.5)


def test_phoenix_live_traces_grow_while_the_eval_runs_and_the_export_adds_none(
    phoenix_server: PhoenixServer, tmp_path: Path
) -> None:
    client = Client(base_url=phoenix_server.url)
    out = tmp_path / "phoenix-live-eval.jsonl"
    records = nemo_gym_rollouts(ROLLOUTS)
    cfg = {"exporters": {"phoenix": {"enabled": True, "base_url": phoenix_server.url}}}
    seen: list[int] = []
    project: list[str] = []

    with live_run(cfg, out, teardown_timeout=30.0, teardown_hard_cap=120.0) as live:
        [channel] = live.channels

        def watch(i: int) -> None:
            if i % 50 == 49 and channel.backend.run_id:
                project[:] = [channel.backend.run_id]
                seen.append(len(root_spans(client, project[0])))

        run_eval(out, live, records, watch)
        before_teardown = traced(client, project[0], ROLLOUTS // 2, 10.0)
    [report] = live.reports
    assert report.lost == 0, report.describe()
    assert seen == sorted(seen) and seen[-1] > seen[0] > 0, seen  # traces grew while the eval ran
    assert before_teardown >= ROLLOUTS // 2
    assert report.traces is not None and report.traces.sent == ROLLOUTS, report.describe()
    assert traced(client, project[0], ROLLOUTS, 30.0) == ROLLOUTS
    write_aggregate(out)
    [result] = export_run(out, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    roots = root_spans(client, project[0])
    assert len(roots) == len({s["context"]["trace_id"] for s in roots}) == ROLLOUTS
    rewards = [a for a in trace_annotations(client, project[0]) if a["name"] == "reward"]
    assert len(rewards) == len({a["trace_id"] for a in rewards}) == ROLLOUTS  # no feedback twice
    ours = [p["name"] for p in client.projects.list() if "phoenix-live-eval" in p["name"]]
    assert ours == project  # one project: the export completed the live run's
    datasets = [d for d in client.datasets.list() if "phoenix-live-eval" in d["name"]]
    assert len(datasets) == 1
    [experiment] = client.experiments.list(dataset_id=datasets[0]["id"])
    runs = client.experiments.get_experiment(experiment_id=experiment["id"])["task_runs"]
    assert len(runs) == ROLLOUTS
    trace_ids = {s["context"]["trace_id"] for s in roots}
    assert {r["trace_id"] for r in runs} == trace_ids  # each run linked to its live trace
