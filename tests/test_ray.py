"""``--executor ray`` on a real local Ray cluster (a head and a second node joined with
``ray start --address``): the same results as the local executor, exactly once per backend when
two drivers race and when a worker is killed mid-export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipt
from tests.load import scaled
from tests.mlflow_server import MlflowServer
from tests.processes import reaped, run_bounded
from tests.ray_cluster import RayCluster
from tests.sweep import make_sweep

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
CONTENT_FILES = ("config.json", "metrics.jsonl", "summary.json", "rollouts.jsonl", "aggregate_metrics.json")


def driver_env(cluster: RayCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(cluster.env, PYTHONPATH=str(REPO))
    return env


def _sigint_as_from_a_terminal() -> None:
    """A command started in the background by a non-interactive shell (``pytest ... &``, some CI
    runners) inherits SIGINT ignored, and Python keeps it ignored: the driver would never see the
    Ctrl-C the test sends. Start it as a terminal would, with the default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def export_cli(cluster: RayCluster, *args: str, timeout: float = 300) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "gym_artifacts.cli", "export", *args, "--json"]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=driver_env(cluster),
        preexec_fn=_sigint_as_from_a_terminal,
    )  # fmt: skip


def results_of(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, list[dict[str, Any]], str]:
    """The driver's exit code, results and stderr; a driver still running after ``timeout``
    (scaled to the load) fails the test, killed and its pipes closed."""
    with reaped(proc):
        try:
            out, err = proc.communicate(timeout=scaled(timeout))
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"export did not finish in {scaled(timeout):.0f}s: {(exc.stderr or b'')[-3000:]!r}")
    try:
        return proc.returncode, json.loads(out), err
    except ValueError:
        pytest.fail(f"stdout is not one JSON array (rc {proc.returncode}): {out[-2000:]!r} {err[-3000:]}")


def by_run(results: list[dict[str, Any]], root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Results keyed by (run folder relative to ``root``, exporter)."""
    return {(str(Path(r["run"]).parent.relative_to(root)), r["exporter"]): r for r in results}


def receipts(runs: list[Path]) -> list[Path]:
    return [p for run in runs for p in run.parent.glob("*_export_done.json")]


def test_ray_export_gives_exactly_the_local_executors_results(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    local_runs = make_sweep(tmp_path / "a", 50)
    ray_runs = make_sweep(tmp_path / "b", 50)
    local_store, ray_store = tmp_path / "store-a", tmp_path / "store-b"

    rc, local, err = results_of(export_cli(ray_cluster, *map(str, local_runs), "-e", "local",
                                           f"exporters.local.root={local_store}", "--jobs", "2"))  # fmt: skip
    assert rc == 0, err[-3000:]
    rc, on_ray, err = results_of(export_cli(ray_cluster, *map(str, ray_runs), "-e", "local",
                                            f"exporters.local.root={ray_store}", "--executor", "ray",
                                            "--ray-address", ray_cluster.address))  # fmt: skip
    assert rc == 0, err[-3000:]

    # same results, run by run, in the order the runs were given
    assert [r["run"] for r in on_ray] == [str(p) for p in ray_runs]
    local_by, ray_by = by_run(local, tmp_path / "a"), by_run(on_ray, tmp_path / "b")
    assert len(ray_by) == len(local_by) == 50
    for key, want in local_by.items():
        got = ray_by[key]
        assert want["status"] == got["status"] == "EXPORTED", (key, got)
        for field in ("backend_run_id", "rows", "bytes", "reason"):
            assert got[field] == want[field], (key, field)
    # one backend run per run, with the same content, and one receipt per run
    folders = sorted(p.name for p in (ray_store / "default").iterdir())
    assert folders == sorted(p.name for p in (local_store / "default").iterdir())
    assert len(folders) == 50
    for name in folders:
        for content in CONTENT_FILES:
            a, b = local_store / "default" / name / content, ray_store / "default" / name / content
            assert a.is_file() == b.is_file(), (name, content)
            if a.is_file():
                assert a.read_bytes() == b.read_bytes(), (name, content)
    assert len(receipts(ray_runs)) == 50
    for run in ray_runs:
        receipt = read_receipt(RunArtifacts.from_path(run).export_done_fpath("local"))
        assert (
            receipt is not None
            and receipt.backend_run_id == ray_by[(run.parent.name, "local")]["backend_run_id"]
        )

    # a second export through the cluster contacts no backend: all SKIPPED, same backend runs
    rc, again, err = results_of(export_cli(ray_cluster, *map(str, ray_runs), "-e", "local",
                                           f"exporters.local.root={ray_store}", "--executor", "ray",
                                           "--ray-address", ray_cluster.address))  # fmt: skip
    assert rc == 0, err[-3000:]
    assert {r["status"] for r in again} == {"SKIPPED"}
    assert [r["backend_run_id"] for r in again] == [r["backend_run_id"] for r in on_ray]
    assert len(receipts(ray_runs)) == 50


def mlflow_runs(server: MlflowServer, experiment: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def assert_once_each(server: MlflowServer, experiment: str, runs: list[Path], steps: int = 5) -> None:
    """One MLflow run per run identity, holding every journaled metric point exactly once."""
    from mlflow.tracking import MlflowClient

    found = mlflow_runs(server, experiment)
    identities = [bookkeeping_of(r.data.tags).get("identity") for r in found]
    assert len(found) == len(runs) == len(set(identities)), (len(found), len(runs))
    client = MlflowClient(server.uri)
    for mlrun in found:
        history = client.get_metric_history(mlrun.info.run_id, "train/reward")
        assert sorted(m.step for m in history) == list(range(steps)), history


def test_two_drivers_export_the_same_runs_at_once_exactly_once(
    ray_cluster: RayCluster, tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    runs = make_sweep(tmp_path / "runs", 20)
    store, experiment = tmp_path / "store", "two-drivers"
    args = [*map(str, runs), "-e", "local", "-e", "mlflow", f"exporters.local.root={store}",
            f"exporters.mlflow.tracking_uri={mlflow_server.uri}", f"exporters.mlflow.experiment_name={experiment}",
            "--executor", "ray", "--ray-address", ray_cluster.address]  # fmt: skip
    drivers = [export_cli(ray_cluster, *args) for _ in range(2)]
    outcomes = [results_of(d) for d in drivers]
    for rc, _, err in outcomes:
        assert rc == 0, err[-3000:]
    first, second = (by_run(results, tmp_path / "runs") for _, results, _ in outcomes)
    for key, a in first.items():
        b = second[key]
        assert {a["status"], b["status"]} <= {"EXPORTED", "SKIPPED"}, (key, a, b)
        assert "EXPORTED" in (a["status"], b["status"]), key
        assert a["backend_run_id"] == b["backend_run_id"], key
    assert len(list((store / "default").iterdir())) == 20
    assert len(receipts(runs)) == 40  # one per run and destination
    assert_once_each(mlflow_server, experiment, runs)


HOOKED_DRIVER = textwrap.dedent(
    """
    import json, sys
    import ray
    from gym_artifacts.export.executors import export_runs
    address, hook, env_vars, runs, overrides, retries = json.loads(sys.argv[1])
    ray.init(address=address, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": hook, "env_vars": env_vars})
    out = export_runs(runs, overrides=overrides, exporters=["local", "mlflow"], executor="ray",
                      ray_retries=retries)
    print(json.dumps([r.to_json() for r in out]))
    """
)


def hooked_driver(
    cluster: RayCluster,
    hook: str,
    env_vars: dict[str, str],
    runs: list[Path],
    overrides: list[str],
    retries: int,
) -> subprocess.Popen[str]:
    """A driver whose Ray workers run ``hook`` (tests/ray_hooks.py) before any task."""
    payload = json.dumps([cluster.address, f"tests.ray_hooks.{hook}", {**env_vars, "PYTHONPATH": str(REPO)},
                          list(map(str, runs)), overrides, retries])  # fmt: skip
    return subprocess.Popen([sys.executable, "-c", HOOKED_DRIVER, payload], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=driver_env(cluster))  # fmt: skip


def driver_results(proc: subprocess.Popen[str], timeout: float = 300) -> list[dict[str, Any]]:
    with reaped(proc):
        out, err = proc.communicate(timeout=scaled(timeout))
    assert proc.returncode == 0, err[-3000:]
    return [r for run in json.loads(out.strip().splitlines()[-1]) for r in run]


def test_without_file_locks_two_drivers_still_export_exactly_once(
    ray_cluster: RayCluster, tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    """As on a network filesystem that does not honour locks: the backends' guards alone."""
    runs = make_sweep(tmp_path / "runs", 10)
    experiment = "no-file-locks"
    overrides = [f"exporters.local.root={tmp_path / 'store'}", f"exporters.mlflow.tracking_uri={mlflow_server.uri}",
                 f"exporters.mlflow.experiment_name={experiment}"]  # fmt: skip
    drivers = [hooked_driver(ray_cluster, "no_file_locks", {}, runs, overrides, 2) for _ in range(2)]
    first, second = (driver_results(d) for d in drivers)
    for a, b in zip(first, second, strict=True):
        assert a["status"] != "FAILED" and b["status"] != "FAILED", (a, b)
        assert a["backend_run_id"] == b["backend_run_id"], (a, b)
    assert len(list((tmp_path / "store" / "default").iterdir())) == 10
    assert len(receipts(runs)) == 20
    assert_once_each(mlflow_server, experiment, runs)


@pytest.mark.parametrize("retries", [0, 2])
def test_a_worker_killed_mid_export_is_retried_or_failed_and_a_rerun_converges(
    ray_cluster: RayCluster, tmp_path: Path, mlflow_server: MlflowServer, retries: int
) -> None:
    runs = make_sweep(tmp_path / "runs", 4)
    experiment = f"killed-worker-{retries}"
    flag = tmp_path / "died"
    overrides = [f"exporters.local.root={tmp_path / 'store'}", f"exporters.mlflow.tracking_uri={mlflow_server.uri}",
                 f"exporters.mlflow.experiment_name={experiment}"]  # fmt: skip
    proc = hooked_driver(ray_cluster, "die_once_before_mlflow_terminate", {"GA_TEST_DIE_FLAG": str(flag)},
                         runs, overrides, retries)  # fmt: skip
    results = driver_results(proc)
    assert flag.is_file(), "no worker was killed"
    mlflow_results = [r for r in results if r["exporter"] == "mlflow"]
    failed = [r for r in mlflow_results if r["status"] == "FAILED"]
    if retries:  # Ray ran the task again on a fresh worker: it found the run by its identity
        assert not failed, failed
    else:  # reported, never silently lost; the other runs went on
        assert len(failed) == 1 and "WorkerCrashedError" in failed[0]["reason"], failed
        assert sum(r["status"] == "EXPORTED" for r in mlflow_results) == 3
    # a rerun (no more kills) converges: one MLflow run per identity, every point once
    rc, again, err = results_of(export_cli(ray_cluster, *map(str, runs), "-e", "local", "-e", "mlflow",
                                           *overrides, "--executor", "ray", "--ray-address",
                                           ray_cluster.address))  # fmt: skip
    assert rc == 0, err[-3000:]
    assert all(r["status"] in ("SKIPPED", "EXPORTED") for r in again)
    assert sum(r["status"] == "EXPORTED" for r in again) == len(failed)  # what the kill cut short
    assert_once_each(mlflow_server, experiment, runs)
    assert len(receipts(runs)) == 8


def test_live_from_ray_actors_lands_once_in_one_backend_run_per_exporter(
    ray_cluster: RayCluster, tmp_path: Path, mlflow_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient

    actors, calls, experiment = 8, 1000, "live-from-ray"
    out = tmp_path / "eval" / "eval.jsonl"
    out.parent.mkdir()
    cfg = {"exporters": {
        "local": {"enabled": True, "root": str(tmp_path / "store")},
        "mlflow": {"enabled": True, "tracking_uri": mlflow_server.uri, "experiment_name": experiment},
    }}  # fmt: skip
    payload = json.dumps([ray_cluster.address, str(out), cfg, actors, calls])
    proc = run_bounded([sys.executable, str(REPO / "tests" / "ray_live_driver.py"), payload], capture_output=True, text=True,
                          timeout=900, env=driver_env(ray_cluster), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    workers = report["workers"]
    assert all(w["flushed"] for w in workers) and not any(w["dropped"] for w in workers), workers
    assert len({w["pid"] for w in workers}) == actors  # eight processes ...
    assert len({w["node"] for w in workers}) == 2  # ... on both nodes
    assert report["lost"] == [0, 0] and report["journal_lost"] == 0, report["reports"]
    expected = sorted((f"actor{i}/x", j) for i in range(actors) for j in range(calls))

    # the journal: every call once, with the caller's step
    lines = [json.loads(line) for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert sorted((k, e["step"]) for e in lines for k in e["metrics"]) == expected
    # the local backend: one run, every call once, every rollout batch once
    [run_dir] = list((tmp_path / "store" / "default").iterdir())
    local_lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted((k, e["step"]) for e in local_lines for k in e["metrics"]) == expected
    assert sorted(
        json.loads(x)["actor"] for x in (run_dir / "rollouts.jsonl").read_text().splitlines()
    ) == list(range(actors))
    # MLflow: one run, every point once
    [mlrun] = mlflow_runs(mlflow_server, experiment)
    client = MlflowClient(mlflow_server.uri)
    for i in range(actors):
        history = client.get_metric_history(mlrun.info.run_id, f"actor{i}/x")
        assert sorted((m.step, m.value) for m in history) == [(j, float(j)) for j in range(calls)]
    # the caller's cost: microseconds (generous bound for a loaded 2-core machine; figures in BENCHMARKS.md)
    costs = sorted(c for w in workers for c in w["costs"])
    median, p99 = costs[len(costs) // 2], costs[int(len(costs) * 0.99)]
    print(f"handle call cost in Ray actors: median {median / 1000:.1f} us, p99 {p99 / 1000:.1f} us")
    assert median < 200_000, (median, p99)


def test_ctrl_c_cancels_the_cluster_export_cleanly_and_a_rerun_completes(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    runs = make_sweep(tmp_path / "runs", 40, rows=2000)  # slow enough to interrupt midway
    store = tmp_path / "store"
    args = [*map(str, runs), "-e", "local", f"exporters.local.root={store}", "--executor", "ray",
            "--ray-address", ray_cluster.address]  # fmt: skip
    driver = export_cli(ray_cluster, *args)
    with reaped(driver):
        deadline = time.monotonic() + scaled(240)
        while time.monotonic() < deadline and driver.poll() is None:
            if (store / "default").is_dir() and any((store / "default").iterdir()):
                break  # the cluster is exporting
            time.sleep(0.05)
        assert driver.poll() is None, "the export finished before it could be interrupted"
        started = len(list((store / "default").iterdir()))
        driver.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, err = driver.communicate(timeout=scaled(60))
    seen = f"{started} of {len(runs)} runs started at SIGINT; exited {time.monotonic() - interrupted:.1f} s later"
    assert driver.returncode == 130, f"{seen}; stderr: {err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert "interrupted:" in err and "not exported (cancelled)" in err
    finished = json.loads(out)  # what finished is still printed, as valid JSON
    assert len({r["run"] for r in finished}) < len(runs)
    assert all(r["status"] == "EXPORTED" for r in finished)
    # nothing keeps running on the cluster for the cancelled driver
    end = time.monotonic() + 60
    while ray_cluster.worker_pids("ray::ray_export_job") and time.monotonic() < end:
        time.sleep(0.5)
    assert not ray_cluster.worker_pids("ray::ray_export_job")
    # a rerun completes what was cancelled: one run folder and one receipt per run
    rc, again, err = results_of(export_cli(ray_cluster, *args))
    assert rc == 0, err[-3000:]
    assert {r["status"] for r in again} <= {"EXPORTED", "SKIPPED"}
    assert len(list((store / "default").iterdir())) == len(runs)
    assert len(receipts(runs)) == len(runs)
