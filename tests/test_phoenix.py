"""The Phoenix backend against a real ``phoenix serve`` on 127.0.0.1 (SQLite working directory),
read back through Phoenix's own client."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("phoenix.client")

from phoenix.client import Client

from gym_artifacts._builtin_exporters.phoenix import PhoenixExporter
from gym_artifacts.export import export_run
from gym_artifacts.exporter import ExportStatus
from gym_artifacts.receipts import read_receipts
from gym_artifacts.run import RunArtifacts
from tests.phoenix_server import PhoenixServer

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
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=300)
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
