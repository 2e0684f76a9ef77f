"""Live misuse: wrong arguments to the live calls never raise, cost microseconds, are counted and
reported, and never make the run unexportable; one value a backend cannot encode loses only its
own call, in every backend."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live.fanout import LiveRun, live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker
from tests.mlflow_store import mlflow_sqlite

MISUSE: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("export_metrics", (None,), {}),
    ("export_metrics", ("reward=1",), {}),
    ("export_metrics", ([("reward", 1.0)],), {}),
    ("export_metrics", ({"reward": 1.0},), {"step": "x"}),
    ("export_metrics", ({"reward": 1.0},), {"step": 2.5}),
    ("export_metrics", ({"reward": 1.0},), {"step": -1}),
    ("export_metrics", ({"reward": 1.0},), {"step": True}),
    ("export_metrics", ({"reward": 1.0},), {"step": [3]}),
    ("export_metrics", ({"reward": 1.0},), {"step": 2**63}),  # past every backend's int64 step
    ("export_metrics", ({"reward": 1.0},), {"step": 2**70}),
    ("export_metrics", ({"reward": 1.0},), {"step": str(2**64)}),
    ("export_rollouts", (None,), {}),
    ("export_rollouts", ("rollouts",), {}),
    ("export_rollouts", ({"id": 1},), {}),
    ("export_rollouts", (7,), {}),
]


def local_steps(store: Path, run: Path) -> list[int]:
    marker = read_marker(RunArtifacts.from_path(run).run_id_marker_fpath("local"))
    assert marker is not None
    lines = (store / "live" / marker.run_id / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_misuse_never_raises_is_cheap_counted_and_the_run_stays_exportable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    out = tmp_path / "out" / "eval.jsonl"
    cfg = {"exporters": {"local": {"enabled": True, "root": str(store), "experiment": "live"}}}
    costs: dict[str, list[float]] = {}
    with live_run(cfg, out) as live:
        assert isinstance(live, LiveRun)
        live.export_metrics({"reward": 0.0}, step=0)
        for _ in range(200):
            for name, args, kwargs in MISUSE:
                start = time.perf_counter()
                getattr(live, name)(*args, **kwargs)
                costs.setdefault(repr((name, args, kwargs)), []).append(time.perf_counter() - start)
        live.export_metrics({"reward": 0.1}, step="5")  # read as 5
        live.export_metrics({"reward": 0.2})  # 6
        live.export_metrics({"reward": 0.3}, step=4.0)  # read as 4
        live.export_metrics({"reward": 0.4}, step=" 9 ")
        live.export_metrics({"reward": 0.5})  # 10
        live.export_rollouts({"id": i} for i in range(2))  # any iterable of records
    assert live.refused.count == 200 * len(MISUSE)
    assert "refused" in caplog.text and str(200 * len(MISUSE)) in caplog.text
    for call, samples in costs.items():
        # microseconds: generous for a loaded machine, far below any I/O
        assert statistics.median(samples) < 200e-6, (call, statistics.median(samples))
    journal = [json.loads(x) for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert [j["step"] for j in journal] == [0, 5, 6, 4, 9, 10]
    assert all(type(j["step"]) is int for j in journal)
    assert local_steps(store, out) == [0, 5, 6, 4, 9, 10]
    out.write_text('{"id": 1}\n')
    out.with_name("eval_aggregate_metrics.json").write_text(
        '[{"agent_ref": {"name": "a"}, "key_metrics": {"pass@1": 1.0}}]'
    )
    post = tmp_path / "post"
    [result] = export_run(
        out, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(post)}}})
    )
    assert result.status is ExportStatus.EXPORTED, result.reason


class Unencodable:
    """A value no backend can encode: converting it to text or a number fails."""

    def __repr__(self) -> str:
        raise RuntimeError("poison")

    __str__ = __repr__

    def __float__(self) -> float:
        raise RuntimeError("poison")


POISON_STEP = 250


@pytest.mark.slow
def test_one_poison_value_among_500_calls_loses_only_itself_in_every_backend(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient

    from tests.wandb_records import offline_runs

    caplog.set_level(logging.WARNING)
    store = tmp_path / "store"
    tracking_uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = {
        "exporters": {
            "local": {"enabled": True, "root": str(store), "experiment": "live"},
            "mlflow": {"enabled": True, "tracking_uri": tracking_uri, "experiment_name": "poison"},
            "wandb": {"enabled": True, "project": "poison", "mode": "offline", "dir": str(tmp_path / "wb")},
        }
    }
    out = tmp_path / "out" / "eval.jsonl"
    with live_run(cfg, out, teardown_timeout=120) as live:
        assert isinstance(live, LiveRun)
        live.flush(120)  # the backends are set up: the 500 calls then queue as one batch
        for step in range(500):
            metrics: dict[Any, Any] = {"reward": step / 500}
            if step == POISON_STEP:
                metrics[("tuple", "key")] = Unencodable()
            live.export_metrics(metrics, step=step)
    valid = [s for s in range(500) if s != POISON_STEP]
    journal = [json.loads(x)["step"] for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert journal == valid
    assert live.journal_lost == 1
    reports = {r.exporter: r for r in live.reports}
    assert set(reports) == {"local", "mlflow", "wandb"}
    for name, report in reports.items():
        assert report.lost <= 1, (name, report.describe())
    assert [s for s in local_steps(store, out) if s != POISON_STEP] == valid
    marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath("mlflow"))
    assert marker is not None
    history = MlflowClient(tracking_uri).get_metric_history(marker.run_id, "reward")
    assert sorted({m.step for m in history} - {POISON_STEP}) == valid
    [wb_run] = offline_runs(tmp_path / "wb")
    assert [s for s in wb_run.steps if s != POISON_STEP] == valid
