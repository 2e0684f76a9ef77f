"""Scale-out: runs per minute exporting a sweep to local + a real MLflow server with ``--jobs 1``,
``--jobs 2``, and ``--executor ray`` on a local cluster of 1 and then 2 nodes (the second joined
with ``ray start --address``), side by side; what bounds them (hashing per core, the server's
request rate); and the live handle's per-call cost in Ray actors.

Every export is cold (no receipt, no identity cache, a fresh local root and MLflow experiment)
and timed as the user sees it: the whole ``gym-artifacts export`` command, start-up included.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, Row, make_run, median, mlflow_server, quantile

SIZES = {  # small runs, large runs, rollouts and recording bytes of a large run
    False: (200, 20, 20_000_000, 5_000_000),
    True: (2, 1, 200_000, 50_000),
}
CONFIGS = (
    ("--jobs 1", ["--jobs", "1"]),
    ("--jobs 2", ["--jobs", "2"]),
    ("Ray 1 node", ["--executor", "ray"]),
    ("Ray 2 nodes", ["--executor", "ray"]),
)
# --tiny (CI) leaves the Ray clusters out: starting them costs minutes on 2 cores, and
# tests/test_ray.py runs the same paths on a real cluster. It exports the small runs only (the
# large ones take the same path; each export is a CLI start-up with the MLflow SDK's import).
TINY_CONFIGS = CONFIGS[:2]


def _cold(runs: list[Path]) -> None:
    for out in runs:
        for receipt in out.parent.glob(f"{out.stem}_*_export_done.json"):
            receipt.unlink()
        out.with_name(f".{out.stem}.gymart-identities.json").unlink(missing_ok=True)


def _export(runs: list[Path], args: list[str], root: Path, tag: str, uri: str, env: dict[str, str]) -> float:
    """Seconds for one cold ``gym-artifacts export`` of ``runs``; every run must be EXPORTED."""
    _cold(runs)
    cmd = [
        sys.executable, "-m", "gym_artifacts.cli", "export", *map(str, runs), "-e", "local", "-e", "mlflow",
        f"exporters.local.root={root / ('store-' + tag)}", f"exporters.mlflow.tracking_uri={uri}",
        f"exporters.mlflow.experiment_name=scale-{tag}", "--json", *args,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=7200)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"export {tag} failed: {proc.stderr[-3000:]}")
    statuses = {r["status"] for r in json.loads(proc.stdout)}
    if statuses != {"EXPORTED"}:
        raise RuntimeError(f"export {tag}: {statuses}")
    return seconds


def _requests_logged(log: Path) -> int:
    """HTTP requests the MLflow server logged so far (uvicorn's access log)."""
    return log.read_text(errors="replace").count('HTTP/1.1"')


def _server_capacity(uri: str, seconds: float = 5.0, clients: int = 4) -> float:
    """Requests per second the server answers with ``clients`` concurrent clients setting tags."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("scale-capacity")).info.run_id
    counts = [0] * clients

    def hammer(i: int) -> None:
        own = MlflowClient(uri)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            own.set_tag(run_id, f"t{i}", str(counts[i]))
            counts[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def _hash_rate(out: Path) -> float:
    """Bytes per second of one run's content identity (cold, in this process)."""
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.identity import content_identities

    _cold([out])
    run = RunArtifacts.from_path(out)
    size = sum(p.stat().st_size for p in run.artifact_files().values())
    start = time.perf_counter()
    content_identities(run)
    return size / (time.perf_counter() - start)


def _live_handle_costs(address: str, root: Path, uri: str, env: dict[str, str]) -> tuple[float, float, int]:
    """Median and p99 (us) of ``export_metrics`` through the handle in 8 actors x 1,000 calls."""
    out = root / "live" / "eval.jsonl"
    out.parent.mkdir()
    cfg = {"exporters": {
        "local": {"enabled": True, "root": str(root / "store-live")},
        "mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "scale-live"},
    }}  # fmt: skip
    payload = json.dumps([address, str(out), cfg, 8, 1000])
    driver = REPO / "tests" / "ray_live_driver.py"
    proc = subprocess.run([sys.executable, str(driver), payload], capture_output=True, text=True,
                          env=env, cwd=root, timeout=1800)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"live driver failed: {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    costs = [c / 1000 for w in report["workers"] for c in w["costs"]]
    return median(costs), quantile(costs, 0.99), len(costs)


def run(tiny: bool) -> list[Row]:
    sys.path.insert(0, str(REPO))
    from tests.ray_cluster import RayCluster
    from tests.sweep import make_sweep

    n_small, n_large, rollouts_bytes, recording_bytes = SIZES[tiny]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ga-scale-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        small = make_sweep(root / "small", n_small)
        large = [
            make_run(root / "large" / f"run-{i:03d}", rollouts_bytes, recording_bytes) for i in range(n_large)
        ]
        server = stack.enter_context(mlflow_server(root / "mlflow", tiny))
        cluster = RayCluster()
        env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
        env.update(cluster.env, MLFLOW_DISABLE_TELEMETRY="true", PYTHONPATH=str(REPO))
        try:
            seconds: dict[tuple[str, str], float] = {}
            requests_before = _requests_logged(server.log)
            configs = TINY_CONFIGS if tiny else CONFIGS
            for label, args in configs:
                if label == "Ray 1 node":
                    cluster.start(nodes=1)
                elif label == "Ray 2 nodes":
                    cluster.add_node()
                if "Ray" in label:
                    args = [*args, "--ray-address", cluster.address]
                tag = label.replace(" ", "").replace("-", "")
                seconds[("small", label)] = _export(small, args, root, f"small-{tag}", server.uri, env)
                if label == "--jobs 1":
                    per_run = (_requests_logged(server.log) - requests_before) / n_small
                if not tiny:
                    seconds[("large", label)] = _export(large, args, root, f"large-{tag}", server.uri, env)
            live = None if tiny else _live_handle_costs(cluster.address, root, server.uri, env)
            capacity = _server_capacity(server.uri, seconds=0.5 if tiny else 5.0)
        finally:
            cluster.stop()
        hash_rate = _hash_rate(large[0])
    large_mb = (rollouts_bytes + recording_bytes) / 1e6
    for kind, count in (("small", n_small),) if tiny else (("small", n_small), ("large", n_large)):
        base = count / seconds[(kind, "--jobs 1")] * 60
        what = f"{count} {kind} runs" + (f" ({large_mb:.0f} MB each)" if kind == "large" else "")
        for label, _ in configs:
            rate = count / seconds[(kind, label)] * 60
            rows.append(Row(
                f"scale: {what}, {label}", f"{rate:,.1f} runs/min ({seconds[(kind, label)]:.1f} s)",
                f"--jobs 1 {base:,.1f} runs/min", rate / base, "reference", None,
            ))  # fmt: skip
    rows.append(Row(
        "scale: MLflow server (1 worker) capacity", f"{capacity:,.0f} requests/s",
        f"{per_run:.1f} requests per small run", None,
        f"ceiling 60 x {capacity:,.0f} / {per_run:.1f} = {60 * capacity / per_run:,.0f} small runs/min", None,
    ))  # fmt: skip
    rows.append(Row("scale: identity hashing, one process", f"{hash_rate / 1e6:,.0f} MB/s",
                    f"large run {large_mb:.0f} MB", None, "per node", None))  # fmt: skip
    if live is not None:
        live_median, live_p99, live_calls = live
        rows.append(Row(
            f"scale: live handle in 8 Ray actors ({live_calls:,} calls), median", f"{live_median:.2f} us",
            f"p99 {live_p99:.2f} us", None, "microseconds", live_median < 10,
        ))  # fmt: skip
    return rows
