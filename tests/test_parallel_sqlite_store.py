"""Parallel exports into an MLflow SQLite store that does not exist yet (issue 31).

The embedded default (local + MLflow on ``sqlite:///mlflow.db``) with ``--jobs 4`` and with
``--executor ray`` on the session's real Ray cluster: the store's schema is created once, never
raced by the tasks; 12 runs give 24 EXPORTED, one MLflow run per run, exit 0, no traceback. The
first attempt is SIGKILLed (driver and workers) while the schema is being created; the store it
leaves is never half-migrated, and the rerun exports everything. A store that someone else's
interrupted migration left broken is one clear FAILED line per run, naming the file.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from tests.sweep import make_sweep

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
RUNS = 12


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(extra or {}, PYTHONPATH=str(REPO))
    return env


def _export(cwd: Path, runs: list[Path], executor_args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The CLI with the embedded default config, in its own process group (killed whole)."""
    cmd = [sys.executable, "-m", "gym_artifacts.cli", "export", *map(str, runs), "--json", *executor_args]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def _kill_during_schema_creation(proc: subprocess.Popen[str], db: Path, timeout: float = 240) -> str:
    """SIGKILL the export's process group as soon as the store's schema is being created (its
    scratch file, or the store file itself, appears); returns which one was seen."""
    scratch = db.with_name(f".{db.name}.creating")
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline and proc.poll() is None:
        if scratch.exists():
            seen = "scratch"
        elif db.exists():
            seen = "store"
        if seen:
            break
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert seen, "the export ended (or timed out) before the schema was being created"
    return seen


def _results(proc: subprocess.Popen[str], timeout: float = 420) -> tuple[int, list[dict[str, Any]], str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"export did not finish in {timeout}s: {err[-3000:]}")
    try:
        return proc.returncode, json.loads(out), err
    except ValueError:
        pytest.fail(f"stdout is not one JSON array (rc {proc.returncode}): {out[-2000:]!r} {err[-3000:]}")


def _tables(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def _assert_exported_once_each(results: list[dict[str, Any]], db: Path, runs: list[Path]) -> None:
    from mlflow.tracking import MlflowClient

    assert len(results) == 2 * len(runs), results
    assert {(r["exporter"], r["status"]) for r in results} == {("local", "EXPORTED"), ("mlflow", "EXPORTED")}, [
        (r["run"], r["exporter"], r["status"], r["reason"]) for r in results if r["status"] != "EXPORTED"
    ]
    client = MlflowClient(f"sqlite:///{db}")
    [experiment] = [e for e in client.search_experiments() if e.name == "gym-evals"]
    found = client.search_runs([experiment.experiment_id], max_results=1000)
    identities = [bookkeeping_of(r.data.tags).get("identity") for r in found]
    assert len(found) == len(runs) == len(set(identities)), (len(found), identities)
    assert {r.info.run_id for r in found} == {r["backend_run_id"] for r in results if r["exporter"] == "mlflow"}
    assert not any(t.startswith("_alembic_tmp_") for t in _tables(db))


@pytest.mark.parametrize("executor", ["jobs", "ray"])
def test_parallel_exports_into_a_fresh_sqlite_store_after_a_kill_during_schema_creation(
    executor: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("mlflow")
    if executor == "ray":
        cluster = request.getfixturevalue("ray_cluster")
        executor_args, env = ["--executor", "ray", "--ray-address", cluster.address], _env(cluster.env)
    else:
        executor_args, env = ["--jobs", "4"], _env()
    runs = make_sweep(tmp_path / "runs", RUNS)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    db = work / "mlflow.db"

    # 1. killed (driver and every worker) while the store's schema is being created
    _kill_during_schema_creation(_export(work, runs, executor_args, env), db)
    # what the kill leaves is no store, or a complete one: never a half-migrated file
    if db.exists() and db.stat().st_size:
        from exporters._mlflow_schema import schema_problem

        assert schema_problem(db) in (None, "absent"), schema_problem(db)
    # nothing was sent before the schema existed (the driver makes it before fanning out)
    assert not [p for run in runs for p in run.parent.glob("*_export_done.json")]

    # 2. the rerun: every run to both backends, one MLflow run each, exit 0, no traceback
    rc, results, err = _results(_export(work, runs, executor_args, env))
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert [r["run"] for r in results[::2]] == [str(p) for p in runs]
    _assert_exported_once_each(results, db, runs)
    assert not db.with_name(f".{db.name}.creating").exists()
    assert not db.with_name(f".{db.name}.schema-lock").exists()


def test_a_store_left_half_migrated_is_one_failed_line_per_run_naming_the_file(tmp_path: Path) -> None:
    """As a store that MLflow's own racing creators left behind: a leftover _alembic_tmp_ table."""
    pytest.importorskip("mlflow")
    from exporters._mlflow_schema import ensure_sqlite_schema

    db = tmp_path / "work" / "mlflow.db"
    db.parent.mkdir(exist_ok=True)
    ensure_sqlite_schema(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE _alembic_tmp_experiments (x INTEGER)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    runs = make_sweep(tmp_path / "runs", 2)
    rc, results, err = _results(_export(db.parent, runs, ["-e", "mlflow"], _env()), timeout=240)
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert [r["status"] for r in results] == ["FAILED", "FAILED"]
    for r in results:
        assert "\n" not in r["reason"] and str(db) in r["reason"], r["reason"]
        assert "half-migrated" in r["reason"] and "_alembic_tmp_experiments" in r["reason"], r["reason"]
    assert db.read_bytes() == before  # refused, never "repaired" behind the user's back
