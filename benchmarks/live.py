"""Live path: the caller's cost of export_metrics with local, MLflow (real server) and W&B
(offline) enabled, next to a synchronous fan-out of the same backends; again with the MLflow
server dead; and the worker's throughput to the local backend."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, median, paced_metric_costs, quantile


def _config(tmp: Path, mlflow_uri: str) -> dict:
    return {
        "exporters": {
            "local": {"enabled": True, "root": str(tmp / "local")},
            "mlflow": {"enabled": True, "tracking_uri": mlflow_uri, "experiment_name": "bench"},
            "wandb": {"enabled": True, "mode": "offline", "project": "bench", "dir": str(tmp / "wandb")},
        }
    }


def _async_costs(cfg: dict, out: Path, calls: int, kill: object = None) -> tuple[list[float], object]:
    from gym_artifacts.live import live_run

    with live_run(cfg, out, teardown_timeout=10) as live:
        live.flush(60)
        if kill is not None:
            kill()  # the server dies before the measured calls
        costs = paced_metric_costs(live, calls)
    return costs, live


def _sync_costs(cfg: dict, out: Path, calls: int) -> list[float]:
    from omegaconf import OmegaConf

    from gym_artifacts.core.config import normalize
    from gym_artifacts.live.fanout import build_live_exporters
    from gym_artifacts.run.artifacts import RunArtifacts

    exporters = build_live_exporters(normalize(OmegaConf.create(cfg)))
    run = RunArtifacts.from_path(out)
    for e in exporters:
        e.run = run
        e.run_id = e._setup()
    costs = []
    metrics = {"loss": 0.5, "reward": 0.25, "tokens": 1234}
    for step in range(calls):
        t0 = time.perf_counter_ns()
        when = time.time()
        for e in exporters:
            e._log_metrics(dict(metrics), step, when)
        costs.append((time.perf_counter_ns() - t0) / 1000)
    for e in exporters:
        from gym_artifacts.contract.hooks import RunStatus

        e._teardown(RunStatus.FINISHED)
    return costs


def _throughput(tmp: Path, points: int) -> float:
    from gym_artifacts.live import live_run

    cfg = {"exporters": {"local": {"enabled": True, "root": str(tmp / "tp")}}}
    per_call = 10
    metrics = {f"m{i}": float(i) for i in range(per_call)}
    with live_run(cfg, tmp / "tp" / "out.jsonl") as live:
        live.flush(10)
        worker = live.channels[0].worker
        assert worker is not None
        worker.max_queued = points  # measure the worker, not the drop policy
        live.journal.worker.max_queued = points
        start = time.perf_counter()
        for step in range(points // per_call):
            live.export_metrics(metrics, step=step)
        live.channels[0].flush(600)
        elapsed = time.perf_counter() - start
    return points / elapsed


def run(tiny: bool) -> list[Row]:
    from tests.mlflow_server import MlflowServer, free_port

    calls = 2_000 if tiny else 20_000
    sync_calls = 20 if tiny else 200
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-live-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ.setdefault("WANDB_SILENT", "true")
        server = MlflowServer(tmp / "server", free_port()).start()
        try:
            cfg = _config(tmp, server.uri)
            costs, _ = _async_costs(cfg, tmp / "a" / "out.jsonl", calls)
            sync = _sync_costs(cfg, tmp / "s" / "out.jsonl", sync_calls)
            dead, _ = _async_costs(cfg, tmp / "d" / "out.jsonl", calls, kill=server.stop)
        finally:
            server.stop()
        med, p99, sync_med = median(costs), quantile(costs, 0.99), median(sync)
        rows.append(
            Row(
                "live: export_metrics median (3 backends)",
                f"{med:.2f} us",
                f"sync {sync_med:.0f} us",
                sync_med / med,
                "<= 5 us, >= 100x",
                med <= 5 and sync_med / med >= 100,
            )
        )
        rows.append(
            Row(
                "live: export_metrics p99 (3 backends)",
                f"{p99:.1f} us",
                f"sync p99 {quantile(sync, 0.99):.0f} us",
                quantile(sync, 0.99) / p99,
                "<= 50 us",
                p99 <= 50,
            )
        )
        dead_med = median(dead)
        rows.append(
            Row(
                "live: median with MLflow server dead",
                f"{dead_med:.2f} us",
                f"alive {med:.2f} us",
                dead_med / med,
                "within noise (<= 1.5x)",
                dead_med <= 1.5 * med and dead_med <= 5,
            )
        )
        points = 20_000 if tiny else 500_000
        tput = _throughput(tmp, points)
        rows.append(
            Row(
                "live: worker throughput to local",
                f"{tput:,.0f} points/s",
                "target 100,000",
                tput / 100_000,
                ">= 100,000 points/s",
                tput >= 100_000,
            )
        )
    return rows
