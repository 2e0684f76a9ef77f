"""A real NeMo Gym 0.7.0 collection logged through ``gym-artifacts instrument --``, beside the same
collection logged by NeMo Gym's own exporters (issue 38, "Must show" 1 and 2).

NeMo Gym's servers start once for the module (``tests/nemo_gym_real.py``: ``gym env start``
against the stub model of ``tests/chat_stub.py``), then each test runs ``gym eval run`` (5 tasks
x 2 repeats, one rollout at a time) into a real ``mlflow server``, W&B offline
(``WANDB_MODE=offline``, read back from its files) and, through gym-artifacts, a local folder and
TensorBoard; then ``gym-artifacts export`` on the output and on a copy of it. Each collection must
end in one backend run per destination, with the params, metric names, values and steps of the
run NeMo Gym's own exporters made of the same collection (the differences, each with its reason,
are in ``KNOWN_DIFFERENCES`` and docs/coming-from-nemo-gym.md).

Needs NeMo Gym's venv (``scripts/nemo_gym_env.sh``, run by ``scripts/test.sh``); skipped without it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chat_stub import ChatStub
from tests.mlflow_server import MlflowServer
from tests.nemo_gym_real import EvalResult, NemoGymServers, gym_eval, nemo_gym_venv
from tests.processes import run_bounded
from tests.server_process import free_port
from tests.wandb_records import OfflineRun, read_offline_run

pytestmark = pytest.mark.slow

MODEL_DELAY_S = 0.25  # each model answer: spreads a collection over a few seconds
# Where ours differs from NeMo Gym's own exporters on purpose (docs/coming-from-nemo-gym.md):
KNOWN_DIFFERENCES = {
    # params: the keys that say where the run is logged are not the eval's config
    "params left out": ("mlflow_", "wandb_", "langsmith_", "exporters."),
    # metrics: the run's coverage, from its files (NeMo Gym has none)
    "metrics added": {"coverage/failed", "omitted_rows"},
    # a rate measured by the clock: two collections never take the same time
    "time-measured": ("rollouts_per_min",),
    # NeMo Gym's coverage/missing (expected - scored) restated: planned rollouts with no result
    # at all, its failed ones (the failures sidecar's rows) no longer counted as missing too
    "restated": {"coverage/missing"},
}
TEARDOWN_REPORTS = ("lost", "did not finish in time")  # what gym-artifacts' loss reports say


@pytest.fixture(scope="module")
def nemo_gym_venv_path() -> Path:
    venv = nemo_gym_venv()
    if venv is None:
        pytest.skip("no NeMo Gym venv: scripts/test.sh builds it (scripts/nemo_gym_env.sh)")
    return venv


@pytest.fixture(scope="module")
def model() -> Iterator[ChatStub]:
    with ChatStub(failing=False) as stub:
        stub.delay_s = MODEL_DELAY_S
        yield stub


@pytest.fixture(scope="module")
def nemo_gym_servers(
    nemo_gym_venv_path: Path, model: ChatStub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NemoGymServers]:
    fds_before = set(os.listdir("/proc/self/fd"))
    servers = NemoGymServers(nemo_gym_venv_path, tmp_path_factory.mktemp("nemo-gym"), model.url).start()
    try:
        yield servers
    finally:
        servers.stop()  # raises when a process of NeMo Gym's session survived
    # nothing of NeMo Gym's servers or the evals left open in this process (logs, pipes)
    leaked = {fd: os.path.realpath(f"/proc/self/fd/{fd}") for fd in set(os.listdir("/proc/self/fd")) - fds_before}
    leaked = {fd: path for fd, path in leaked.items() if "nemo-gym" in path or "ours-" in path or "own-" in path}
    assert leaked == {}, leaked


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port()).start()
    try:
        yield server
    finally:
        server.stop()


# -- reading what each destination holds ----------------------------------------------------------


def mlflow_runs(uri: str, experiment: str) -> list[Any]:
    """Every run of the experiment, deleted ones too."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return client.search_runs([found.experiment_id], run_view_type=ViewType.ALL)


def metric_histories(uri: str, run: Any) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
    }


def wandb_offline_folders(folder: Path) -> list[Path]:
    return sorted(folder.rglob("offline-run-*"))


def wandb_run(folder: Path) -> OfflineRun:
    [one] = wandb_offline_folders(folder)
    [record] = one.glob("run-*.wandb")
    return read_offline_run(record)


def local_runs(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "local").glob("*/*") if p.is_dir())


def tensorboard_folders(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "tensorboard").glob("*") if p.is_dir())


def normalized(value: str, folder: Path) -> str:
    return value.replace(str(folder), "<eval folder>")


def is_time_measured(name: str) -> bool:
    return any(part in name for part in KNOWN_DIFFERENCES["time-measured"])


def same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def export(out: Path) -> subprocess.CompletedProcess[str]:
    """``gym-artifacts export OUT.jsonl`` to the run's saved exporters (W&B offline, as live)."""
    return run_bounded(
        [sys.executable, "-m", "gym_artifacts.cli", "export", str(out)],
        capture_output=True, text=True, timeout=300, cwd=out.parent,
        env={**os.environ, "WANDB_MODE": "offline"},
    )  # fmt: skip


def run_pair(
    servers: NemoGymServers, mlflow: MlflowServer, root: Path, name: str, extra: tuple[str, ...] = ()
) -> tuple[EvalResult, EvalResult]:
    """The same collection twice: NeMo Gym's own exporters, then through ``instrument``."""
    own = gym_eval(servers, root / f"own-{name}", instrument=False, mlflow_uri=mlflow.uri,
                   experiment=f"own-{name}", extra=extra)  # fmt: skip
    ours = gym_eval(servers, root / f"ours-{name}", instrument=True, mlflow_uri=mlflow.uri,
                    experiment=f"ours-{name}", extra=extra)  # fmt: skip
    for result in (own, ours):
        assert result.returncode == 0, result.log[-4000:]
    return own, ours


# -- what must hold -------------------------------------------------------------------------------


def assert_one_run_per_destination(mlflow: MlflowServer, ours: EvalResult, experiment: str) -> None:
    runs = mlflow_runs(mlflow.uri, experiment)
    assert [(r.info.status, r.info.lifecycle_stage) for r in runs] == [("FINISHED", "active")], runs
    folders = wandb_offline_folders(ours.folder)
    assert len(folders) == 1, folders  # one W&B run id in one offline folder (`wandb sync` once)
    assert len(local_runs(ours.folder)) == 1, local_runs(ours.folder)
    assert len(tensorboard_folders(ours.folder)) == 1, tensorboard_folders(ours.folder)


def assert_no_teardown_report(ours: EvalResult) -> None:
    """Neither the eval nor its forked health-check workers report losses that did not happen."""
    reports = [
        line for line in ours.log.splitlines()
        if "live logging" in line and any(word in line for word in TEARDOWN_REPORTS)
    ]  # fmt: skip
    assert reports == [], "\n".join(reports)
    assert ours.left_running == [], f"processes left running by the eval: {ours.left_running}"


def restated(own: dict[str, list[tuple[int, Any]]], ours: EvalResult) -> dict[str, list[tuple[int, Any]]]:
    """NeMo Gym's own histories with its ``coverage/missing`` as this project states it: less
    the rows of the failures sidecar (KNOWN_DIFFERENCES["restated"])."""
    sidecar = ours.folder / "OUT_failures.jsonl"
    failed = len(sidecar.read_text().splitlines()) if sidecar.is_file() else 0
    return {
        key: [(step, value - failed) for step, value in history] if key in KNOWN_DIFFERENCES["restated"] else history
        for key, history in own.items()
    }


def assert_histories_like_nemo_gyms(
    own: dict[str, list[tuple[int, Any]]], ours: dict[str, list[tuple[int, Any]]], where: str
) -> None:
    """NeMo Gym's step metrics (``progress/*``, logged with its step): the same steps and values
    (a clock-measured rate: the same steps). What it logs without a step (the aggregate and
    coverage metrics): the same value, once, after the last step (documented: last step + 1 in
    every backend, where NeMo Gym's MLflow says 0 and its W&B counts its own calls)."""
    last = max(s for key, history in own.items() if key.startswith("progress/") for s, _ in history)
    problems = []
    for key, history in sorted(own.items()):
        mine = ours.get(key)
        if mine is None:
            problems.append(f"{key}: missing")
        elif key.startswith("Rollouts."):  # NeMo Gym's rollout table (its file names differ)
            continue
        elif key.startswith("progress/"):
            if [s for s, _ in mine] != [s for s, _ in history]:
                problems.append(f"{key}: steps {[s for s, _ in mine]} != {[s for s, _ in history]}")
            elif not is_time_measured(key) and not all(
                same_value(a, b) for (_, a), (_, b) in zip(mine, history, strict=True)
            ):
                problems.append(f"{key}: values {mine} != {history}")
        elif len(mine) != 1 or not same_value(mine[0][1], history[-1][1]) or mine[0][0] <= last:
            problems.append(f"{key}: {mine}, expected {history[-1][1]} once after step {last}")
    assert problems == [], f"{where}:\n" + "\n".join(problems)


def assert_mlflow_like_nemo_gyms(mlflow: MlflowServer, own: EvalResult, ours: EvalResult, name: str) -> None:
    [own_run] = mlflow_runs(mlflow.uri, f"own-{name}")
    [our_run] = mlflow_runs(mlflow.uri, f"ours-{name}")
    left_out = KNOWN_DIFFERENCES["params left out"]
    expected_params = {
        k: normalized(v, own.folder) for k, v in own_run.data.params.items() if not k.startswith(left_out)
    }
    assert {k: normalized(v, ours.folder) for k, v in our_run.data.params.items()} == expected_params
    own_metrics = metric_histories(mlflow.uri, own_run)
    our_metrics = metric_histories(mlflow.uri, our_run)
    assert set(own_metrics) <= set(our_metrics) <= set(own_metrics) | KNOWN_DIFFERENCES["metrics added"]
    assert_histories_like_nemo_gyms(restated(own_metrics, ours), our_metrics, "MLflow")


def wandb_histories(run: OfflineRun) -> dict[str, list[tuple[int, Any]]]:
    keys: dict[str, list[tuple[int, Any]]] = {}
    for row in run.history:
        for key, value in row.items():
            if not key.startswith("_"):
                keys.setdefault(key, []).append((row["_step"], value))
    return keys


def assert_wandb_like_nemo_gyms(own: EvalResult, ours: EvalResult) -> None:
    own_keys, our_keys = wandb_histories(wandb_run(own.folder)), wandb_histories(wandb_run(ours.folder))
    assert set(own_keys) <= set(our_keys) <= set(own_keys) | KNOWN_DIFFERENCES["metrics added"]
    assert_histories_like_nemo_gyms(restated(own_keys, ours), our_keys, "W&B")


def assert_a_copy_exports_into_the_same_runs(mlflow: MlflowServer, ours: EvalResult, experiment: str) -> None:
    copy = ours.folder.with_name(ours.folder.name + "-copy")
    shutil.copytree(ours.folder, copy, symlinks=True)
    proc = export(copy / "OUT.jsonl")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_one_run_per_destination(mlflow, ours, experiment)
    assert not wandb_offline_folders(copy) or wandb_offline_folders(copy) == [
        copy / p.relative_to(ours.folder) for p in wandb_offline_folders(ours.folder)
    ]


@pytest.mark.parametrize("route_failures", [False, True], ids=["clean", "failures-routed-aside"])
def test_a_collection_through_instrument_is_nemo_gyms_run_once_per_destination(
    nemo_gym_servers: NemoGymServers, mlflow: MlflowServer, model: ChatStub, tmp_path: Path, route_failures: bool
) -> None:
    name = "routed" if route_failures else "clean"
    model.failing = route_failures  # a failed rollout ends a collection in error unless routed aside
    try:
        extra = ("+route_failures_to_sidecar=true",) if route_failures else ()
        own, ours = run_pair(nemo_gym_servers, mlflow, tmp_path, name, extra)
    finally:
        model.failing = False
    if route_failures:
        failures = (ours.folder / "OUT_failures.jsonl").read_text().splitlines()
        assert len(failures) == 2 and len((ours.folder / "OUT.jsonl").read_text().splitlines()) == 8
    assert_no_teardown_report(ours)
    # the live runs, as the eval left them, are NeMo Gym's ...
    assert_mlflow_like_nemo_gyms(mlflow, own, ours, name)
    assert_wandb_like_nemo_gyms(own, ours)
    # ... and stay so, one run per destination, once the export completed them
    proc = export(ours.out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_one_run_per_destination(mlflow, ours, f"ours-{name}")
    assert_mlflow_like_nemo_gyms(mlflow, own, ours, name)
    assert_wandb_like_nemo_gyms(own, ours)
    assert_a_copy_exports_into_the_same_runs(mlflow, ours, f"ours-{name}")


def journal_steps(out: Path) -> list[int]:
    fpath = out.with_name(out.stem + "_metrics.jsonl")
    if not fpath.is_file():
        return []
    steps = []
    for line in fpath.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if any(k.startswith("progress/") for k in record.get("metrics", {})):
            steps.append(record["step"])
    return steps


def test_mlflow_killed_mid_collection_costs_the_eval_nothing_and_the_export_completes_the_run(
    nemo_gym_servers: NemoGymServers, mlflow: MlflowServer, tmp_path: Path
) -> None:
    baseline = gym_eval(nemo_gym_servers, tmp_path / "server-up", instrument=True, mlflow_uri=mlflow.uri,
                        experiment="server-up")  # fmt: skip
    assert baseline.returncode == 0, baseline.log[-4000:]
    killed_at: list[int] = []

    def kill_mlflow_after_the_first_progress_step(proc: subprocess.Popen[bytes]) -> None:
        out = tmp_path / "server-killed" / "OUT.jsonl"
        deadline = time.monotonic() + 120
        while not journal_steps(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_at.extend(journal_steps(out))
        mlflow.stop()

    try:
        killed = gym_eval(nemo_gym_servers, tmp_path / "server-killed", instrument=True, mlflow_uri=mlflow.uri,
                          experiment="server-killed", while_running=kill_mlflow_after_the_first_progress_step)  # fmt: skip
    finally:
        if mlflow.proc is None:
            mlflow.start()  # back up (the same store) for the export and the other tests
    assert killed.returncode == 0, killed.log[-4000:]
    all_steps = journal_steps(killed.out)
    assert killed_at and killed_at[-1] < all_steps[-1], (killed_at, all_steps)  # killed mid-collection
    print(f"eval wall time: MLflow server up {baseline.wall_s:.1f} s, killed mid-collection {killed.wall_s:.1f} s")
    assert killed.wall_s <= 1.5 * baseline.wall_s, (killed.wall_s, baseline.wall_s)
    proc = export(killed.out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = mlflow_runs(mlflow.uri, "server-killed")
    assert run.info.status == "FINISHED"
    histories = metric_histories(mlflow.uri, run)
    progress = [name for name in histories if name.startswith("progress/")]
    assert progress
    for name in progress:
        assert [s for s, _ in histories[name]] == all_steps, name
