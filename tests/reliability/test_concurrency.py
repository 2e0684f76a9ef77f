"""Concurrent exports: of one run, one process sends and the others wait, then skip; a killed
holder does not keep the lock; exports of different runs in parallel do not interfere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipt
from tests.load import scaled
from tests.mlflow_server import MlflowServer
from tests.processes import reaped

REPO = Path(__file__).resolve().parents[2]


def spawn(run: Path, *overrides: str, exporters: tuple[str, ...] = ("local",)) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    selected = [a for e in exporters for a in ("-e", e)]
    return subprocess.Popen([sys.executable, "-m", "gym_artifacts.cli", "export", str(run), *selected, "--json", *overrides],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


@pytest.mark.parametrize("writers", [2, 8])
def test_many_processes_export_one_run_once(
    quickstart_run: Path, tmp_path: Path, own_mlflow_server: MlflowServer, writers: int
) -> None:
    server = own_mlflow_server.start()
    overrides = (f"exporters.local.root={tmp_path / 'store'}", f"exporters.mlflow.tracking_uri={server.uri}")
    procs = [spawn(quickstart_run, *overrides, exporters=("local", "mlflow")) for _ in range(writers)]
    results = []
    with reaped(procs):
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
            results.extend(json.loads(out))
    for name in ("local", "mlflow"):
        statuses = sorted(r["status"] for r in results if r["exporter"] == name)
        assert statuses == ["EXPORTED"] + ["SKIPPED"] * (writers - 1), statuses
        assert len({r["backend_run_id"] for r in results if r["exporter"] == name}) == 1
    run = RunArtifacts.from_path(quickstart_run)
    assert read_receipt(run.export_done_fpath("local")) is not None
    assert len(list((tmp_path / "store" / "default").iterdir())) == 1
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    assert len(client.search_runs([client.get_experiment_by_name("gym-evals").experiment_id])) == 1


@pytest.mark.slow
def test_a_killed_lock_holder_does_not_block_the_next_export(quickstart_run: Path, tmp_path: Path) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from pathlib import Path
            from gym_artifacts.core.locking import exclusive_lock
            with exclusive_lock(Path({str(run.export_lock_fpath("local"))!r})):
                print("locked", flush=True)
                time.sleep(120)
        """)], cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip
    with reaped(holder):
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
    started = time.monotonic()
    proc = spawn(quickstart_run, f"exporters.local.root={tmp_path / 'store'}")
    with reaped(proc):
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)[0]["status"] == "EXPORTED"
    assert time.monotonic() - started < scaled(30)


def test_a_live_holder_makes_others_wait_or_report(quickstart_run: Path, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    import gym_artifacts.export.engine as export_module
    from gym_artifacts import export_run
    from gym_artifacts.core.locking import exclusive_lock

    run = RunArtifacts.from_path(quickstart_run)
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}})
    original = export_module.LOCK_WAIT_SECONDS
    export_module.LOCK_WAIT_SECONDS = 0.5
    try:
        with exclusive_lock(run.export_lock_fpath("local")):
            [result] = export_run(run, cfg)
    finally:
        export_module.LOCK_WAIT_SECONDS = original
    assert result.status.value == "FAILED"
    assert "is being exported to local by another process" in (result.reason or "")


def test_different_runs_in_parallel_do_not_interfere(
    make_run, tmp_path: Path, own_mlflow_server: MlflowServer
) -> None:
    server = own_mlflow_server.start()
    runs = [make_run(f"run{i}") for i in range(4)]
    for i, run in enumerate(runs):  # different runs: different content
        with open(run, "a") as fh:
            fh.write(json.dumps({"extra": i}) + "\n")
        run.with_name(f"run{i}_aggregate_metrics.json").touch()
    overrides = (f"exporters.local.root={tmp_path / 'store'}", f"exporters.mlflow.tracking_uri={server.uri}")
    procs = [spawn(r, *overrides, exporters=("local", "mlflow")) for r in runs]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.extend(json.loads(out))
    assert [r["status"] for r in results] == ["EXPORTED"] * 8
    assert len({r["backend_run_id"] for r in results if r["exporter"] == "mlflow"}) == 4
    assert len(list((tmp_path / "store" / "default").iterdir())) == 4
