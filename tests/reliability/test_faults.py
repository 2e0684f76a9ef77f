"""Fault injection: a tracker that is down, hangs, errors or crawls never fails or stalls the eval,
teardown keeps its deadline, the report names what was lost, and a later post-run export
completes the run from its files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run
from tests.mlflow_server import MlflowServer
from tests.processes import run_bounded
from tests.reliability.faulty_servers import HttpFault, black_hole, http_fault

REPO = Path(__file__).resolve().parents[2]
STEPS = 300
TEARDOWN = 3.0
# Teardown gives up at its hard cap (TEARDOWN + 1 s); what it does after that is bookkeeping.
TEARDOWN_BOUND = TEARDOWN + 5.0
# "The eval never waited": a call that waited on the faulty backend costs at least its request
# timeout (1 s here), so no call may come near it, and the median stays within a factor of a
# healthy local-only run of the same shape measured in the same test session (a ratio, not an
# absolute time: these machines are shared and noisy).
NEVER_WAITED_S = 0.25
MEDIAN_FACTOR = 20.0


@pytest.fixture(scope="module")
def healthy_median(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The median cost of a live metric call with a healthy local backend, this session."""
    root = tmp_path_factory.mktemp("healthy")
    costs, _, live = run_eval({"exporters": {"local": {"enabled": True, "root": str(root / "local")}}}, root / "eval.jsonl")
    assert live.reports[0].lost == 0
    return statistics.median(costs)


def assert_never_waited(costs: list[float], healthy_median: float) -> None:
    assert max(costs) < NEVER_WAITED_S, max(costs)
    assert statistics.median(costs) < MEDIAN_FACTOR * max(healthy_median, 5e-6), (statistics.median(costs), healthy_median)
MLFLOW_FAULTS = ["killed-mid-run", "black-hole", "http-500", "http-429-retry-after", "slow-3s"]


@contextlib.contextmanager
def mlflow_fault(kind: str, server: MlflowServer) -> Iterator[tuple[str, Any]]:
    """(tracking URI, a callable run at mid-run or None) for one kind of fault."""
    if kind == "killed-mid-run":
        server.start()
        yield server.uri, server.stop
    elif kind == "black-hole":
        with black_hole() as hole:
            yield hole.uri, None
    elif kind == "http-500":
        with http_fault(HttpFault(status=500)) as (uri, _):
            yield uri, None
    elif kind == "http-429-retry-after":
        with http_fault(HttpFault(status=429, retry_after=30)) as (uri, _):
            yield uri, None
    elif kind == "slow-3s":
        with http_fault(HttpFault(status=200, delay=3.0, body=b"{}")) as (uri, _):
            yield uri, None
    else:
        raise ValueError(kind)


def finish_eval(out: Path, source: Path) -> None:
    """What the eval writes at its end: rollouts, then (newer) aggregate metrics."""
    shutil.copyfile(source, out)
    shutil.copyfile(
        source.with_name("eval_aggregate_metrics.json"), out.with_name(out.stem + "_aggregate_metrics.json")
    )


def run_eval(cfg: dict, out: Path, mid_run: Any = None) -> tuple[list[float], float, Any]:
    costs = []
    # a setup still running counts as progress: the cap keeps the test's bound
    with live_run(cfg, out, teardown_timeout=TEARDOWN, teardown_hard_cap=TEARDOWN + 1.0) as live:
        for step in range(STEPS):
            if step == STEPS // 2 and mid_run is not None:
                mid_run()
            t0 = time.perf_counter()
            live.export_metrics({"reward": step / STEPS, "loss": 1.0 / (step + 1)}, step=step)
            costs.append(time.perf_counter() - t0)
            if step % 50 == 0:
                time.sleep(0.02)
        ended = time.monotonic()
    return costs, time.monotonic() - ended, live


@pytest.mark.parametrize("kind", MLFLOW_FAULTS)
def test_mlflow_live_fault(
    kind: str, quickstart_run: Path, own_mlflow_server: MlflowServer, tmp_path: Path
, healthy_median: float) -> None:
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    with mlflow_fault(kind, own_mlflow_server) as (uri, mid_run):
        cfg = {
            "exporters": {
                "mlflow": {
                    "enabled": True,
                    "tracking_uri": uri,
                    "experiment_name": "faults",
                    "live_request_timeout": 1.0,
                },
                "local": {"enabled": True, "root": str(tmp_path / "local")},
            },
        }
        costs, teardown_seconds, live = run_eval(cfg, out, mid_run)
    reports = {r.exporter: r for r in live.reports}
    # the eval never waited and never saw an exception
    assert_never_waited(costs, healthy_median)
    assert teardown_seconds < TEARDOWN_BOUND
    # the result names what was lost; the healthy backend lost nothing
    lost = reports["mlflow"]
    assert lost.setup_error or lost.lost > 0, lost.describe()
    assert "mlflow" in lost.describe()
    assert reports["local"].lost == 0 and reports["local"].delivered >= STEPS
    # a later post-run export (to a healthy store) completes the run from the journal
    finish_eval(out, quickstart_run)
    store = f"sqlite:///{tmp_path / 'recovered.db'}"
    [result] = export_run(
        out, OmegaConf.create({"exporters": {"mlflow": {"enabled": True, "tracking_uri": store}}})
    )
    assert result.status is ExportStatus.EXPORTED, result.reason
    from mlflow.tracking import MlflowClient

    assert [m.step for m in MlflowClient(store).get_metric_history(result.backend_run_id, "reward")] == list(
        range(STEPS)
    )


@pytest.mark.parametrize("kind", ["black-hole", "http-500", "http-429-retry-after", "slow-3s"])
def test_mlflow_post_run_fault(
    kind: str, quickstart_run: Path, own_mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    with mlflow_fault(kind, own_mlflow_server) as (uri, _):
        cfg = OmegaConf.create({"exporters": {"mlflow": {
            "enabled": True, "tracking_uri": uri, "export_request_timeout": 2, "export_request_retries": 1,
        }}})  # fmt: skip
        started = time.monotonic()
        [result] = export_run(quickstart_run, cfg)
        elapsed = time.monotonic() - started
    assert result.status is ExportStatus.FAILED
    assert result.reason and ("MlflowException" in result.reason or "Error" in result.reason), result.reason
    assert elapsed < 60
    assert not quickstart_run.with_name("eval_mlflow_export_done.json").exists()
    healthy = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": f"sqlite:///{tmp_path / 'ok.db'}"}}}
    )
    [again] = export_run(quickstart_run, healthy)
    assert again.status is ExportStatus.EXPORTED, again.reason


@pytest.mark.parametrize("kind", ["black-hole", "http-500"])
def test_wandb_online_pointed_at_a_broken_loopback(
    kind: str, quickstart_run: Path, own_mlflow_server: MlflowServer, tmp_path: Path
, healthy_median: float) -> None:
    out = tmp_path / "eval.jsonl"
    with mlflow_fault(kind, own_mlflow_server) as (uri, _):
        cfg = {
            "exporters": {
                "wandb": {"enabled": True, "mode": "online", "base_url": uri, "api_key": "x" * 40, "init_timeout": 2,
                          "project": "faults", "dir": str(tmp_path / "wb")},
                "local": {"enabled": True, "root": str(tmp_path / "local")},
            }
        }  # fmt: skip
        costs, teardown_seconds, live = run_eval(cfg, out)
    reports = {r.exporter: r for r in live.reports}
    assert_never_waited(costs, healthy_median)
    assert teardown_seconds < TEARDOWN_BOUND
    assert reports["wandb"].setup_error
    assert reports["local"].lost == 0
    finish_eval(out, quickstart_run)
    offline = OmegaConf.create(
        {"exporters": {"wandb": {"enabled": True, "mode": "offline", "dir": str(tmp_path / "wb2")}}}
    )
    [result] = export_run(out, offline)
    assert result.status is ExportStatus.EXPORTED, result.reason


LOCAL_FAULT_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, signal, sys, time
    mode, root, out = sys.argv[1:4]
    if mode == "disk-full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))
    from gym_artifacts.live import live_run
    cfg = {"exporters": {"local": {"enabled": True, "root": root}}}
    costs = []
    with live_run(cfg, out, teardown_timeout=3, teardown_hard_cap=3) as live:
        big = {"text": "x" * 2000}
        for step in range(300):
            t0 = time.perf_counter()
            live.export_metrics({"reward": step / 300}, step=step)
            live.export_rollouts([big])
            costs.append(time.perf_counter() - t0)
    report = live.reports[0]
    costs.sort()
    print(json.dumps({"median": costs[150], "max": costs[-1], "lost": report.lost, "setup_error": report.setup_error,
                      "describe": report.describe()}))
    """
)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` re-mounted read-only (a bind mount: binding even root's writes)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = run_bounded(["mount", "--bind", str(path), str(path)], capture_output=True, text=True, timeout=60)
    if mount.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mount.stderr.strip()}")
    try:
        ro = run_bounded(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True, timeout=60)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {ro.stderr.strip()}")
        yield path
    finally:
        run_bounded(["umount", str(path)], timeout=60)


@pytest.mark.slow
def test_local_backend_disk_full(quickstart_run: Path, tmp_path: Path, healthy_median: float) -> None:
    root = tmp_path / "store"
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(REPO)
    proc = run_bounded([sys.executable, "-c", LOCAL_FAULT_SCRIPT, "disk-full", str(root), str(out)],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # each call here also sends a 2 KB rollout: a looser factor over the metric-only baseline
    assert result["max"] < NEVER_WAITED_S and result["median"] < 5 * MEDIAN_FACTOR * max(healthy_median, 5e-6), result
    assert result["lost"] > 0 and "File too large" in result["describe"], result
    journal = [json.loads(x)["step"] for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert journal == list(range(STEPS))  # the journal (small lines) kept every step
    # Later, with room, the post-run export completes the run from the files.
    finish_eval(out, quickstart_run)
    store = tmp_path / "recovered"
    [recovered] = export_run(
        out, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    )
    assert recovered.status is ExportStatus.EXPORTED, recovered.reason
    sent = (store / "default" / recovered.backend_run_id / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in sent] == list(range(STEPS))


@pytest.mark.slow
def test_local_backend_read_only(quickstart_run: Path, tmp_path: Path, healthy_median: float) -> None:
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    root = tmp_path / "store"
    cfg = {"exporters": {"local": {"enabled": True, "root": str(root)}}}
    with read_only(root):
        costs, teardown_seconds, live = run_eval(cfg, out)
        [report] = live.reports
        assert "Read-only file system" in (report.setup_error or ""), report.describe()
        assert_never_waited(costs, healthy_median)
        assert teardown_seconds < TEARDOWN_BOUND
        finish_eval(out, quickstart_run)
        [failed] = export_run(out, OmegaConf.create(cfg))
        assert failed.status is ExportStatus.FAILED and "Read-only file system" in (failed.reason or "")
        assert not out.with_name("eval_local_export_done.json").exists()
    [recovered] = export_run(out, OmegaConf.create(cfg))
    assert recovered.status is ExportStatus.EXPORTED, recovered.reason
    sent = (root / "default" / recovered.backend_run_id / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in sent] == list(range(STEPS))
