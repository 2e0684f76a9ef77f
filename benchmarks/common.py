"""Shared pieces of the benchmarks: result rows, timing, peak memory, test data."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    """One measured figure, its same-run baseline, and the target it is held to."""

    name: str
    figure: str
    baseline: str
    ratio: float | None
    target: str
    met: bool | None
    peak_mb: float | None = None
    note: str = ""


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


PAUSE_EVERY = 100  # calls between the eval's pauses
PAUSE_S = 0.002  # the pause: the eval's own work between steps


def paced_metric_costs(live: object, calls: int) -> list[float]:
    """Microseconds of each of ``calls`` ``export_metrics`` calls (three numbers), at an eval's
    brisk rate: a 2 ms pause every 100 calls, as if it did work between steps. The call at each
    index ``i % PAUSE_EVERY == 0`` is the first one after a pause (see ``after_pause_split``)."""
    export = live.export_metrics  # type: ignore[attr-defined]
    metrics = {"loss": 0.5, "reward": 0.25, "tokens": 1234}
    clock = time.perf_counter_ns
    costs = []
    for step in range(calls):
        t0 = clock()
        export(metrics, step=step)
        costs.append((clock() - t0) / 1000)
        if step % PAUSE_EVERY == PAUSE_EVERY - 1:
            time.sleep(PAUSE_S)
    return costs


def after_pause_split(costs_us: list[float]) -> tuple[list[float], list[float]]:
    """The calls made right after a pause, and all the others. On a virtual machine a core that
    slept for the pause comes back slow (caches and predictors cold): these 1 % of the calls are
    what p99 and most of p99.9 measure."""
    after = costs_us[::PAUSE_EVERY]
    others = [c for i, c in enumerate(costs_us) if i % PAUSE_EVERY]
    return after, others


def tail_summary(costs_us: list[float]) -> dict[str, float]:
    """Median, p99, p99.9 and max (us), how many calls took over 1 ms, and the same split by
    whether the call came right after a pause (``after_pause_*``) or not (``unpaused_*``)."""
    ordered = sorted(costs_us)
    n = len(ordered)
    after, others = after_pause_split(costs_us)
    return {
        "calls": n,
        "median": ordered[n // 2],
        "p99": ordered[min(n - 1, int(n * 0.99))],
        "p999": ordered[min(n - 1, int(n * 0.999))],
        "max": ordered[-1],
        "over_1ms": sum(1 for c in ordered if c > 1000),
        "after_pause_median": median(after) if after else 0.0,
        "unpaused_p999": quantile(others, 0.999) if others else 0.0,
        "unpaused_max": max(others, default=0.0),
    }


def idle_wakeup_cost_us(calls: int = 5_000) -> float:
    """Median microseconds of an empty function call made right after the same pause: what the
    machine alone charges the first call after the eval's thread slept (a reference, no library)."""

    def nothing(metrics: dict, step: int | None = None) -> None:
        return None

    class Empty:
        export_metrics = staticmethod(nothing)

    after, _ = after_pause_split(paced_metric_costs(Empty(), calls))
    return median(after)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    return min(timed(fn) for _ in range(repeat))


MEASURED_TIMEOUT_S = 4 * 3600  # a hung measurement must end; 100,000 traces to MLflow took over an hour


def run_measured(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, float]:
    """Run Python ``code`` in a fresh process; it prints a JSON dict; adds peak RSS (MB)."""
    wrapper = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from benchmarks.common import peak_rss_mb\n"
        "__result = {}\n"
        f"{code}\n"
        "__result['peak_rss_mb'] = peak_rss_mb()\n"
        "print(json.dumps(__result))\n"
    )
    full_env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", **(env or {}))
    full_env.pop("WANDB_SERVICE", None)
    proc = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, env=full_env, cwd=cwd,
        timeout=MEASURED_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Unlike ru_maxrss it starts anew at exec, so a
    child does not inherit the high-water mark of the process that spawned it."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_rollouts(fpath: Path, rows: int, row_bytes: int = 2000, seed: int = 0) -> int:
    """``rows`` NeMo Gym-like rollouts of about ``row_bytes`` each; returns the file size."""
    rng = random.Random(seed)
    pad = max(0, row_bytes - 260)
    with open(fpath, "w") as fh:
        for i in range(rows):
            row = {
                "task_index": i,
                "agent_ref": {"name": "agent"},
                "responses_create_params": {"input": [{"role": "user", "content": "q" * (pad // 3)}]},
                "response": {
                    "output_text": "a" * (pad - pad // 3),
                    "usage": {"output_tokens": rng.randint(1, 999)},
                },
                "reward": rng.random(),
            }
            fh.write(json.dumps(row) + "\n")
    return fpath.stat().st_size


def write_random(fpath: Path, size: int, block: int = 1 << 22) -> None:
    with open(fpath, "wb") as fh:
        left = size
        while left > 0:
            n = min(block, left)
            fh.write(os.urandom(n))
            left -= n


def make_run(dpath: Path, rollouts_bytes: int, recording_bytes: int) -> Path:
    """A run of about the given sizes: rollouts, aggregate metrics, a recording."""
    dpath.mkdir(parents=True, exist_ok=True)
    out = dpath / "run.jsonl"
    write_rollouts(out, max(1, rollouts_bytes // 2000))
    artifacts = dpath / "run_artifacts"
    artifacts.mkdir(exist_ok=True)
    write_random(artifacts / "recording.mp4", recording_bytes)
    (artifacts / "session_times.json").write_text('{"start": "a", "end": "b"}')
    agg = [
        {
            "agent_ref": {"name": "agent"},
            "agent_metrics": {"mean/reward": 0.5},
            "key_metrics": {"pass@1": 0.5},
        }
    ]
    (dpath / "run_aggregate_metrics.json").write_text(json.dumps(agg))
    old = time.time() - 120  # outside the identity cache's racy window, as a finished run is
    for p in [out, dpath / "run_aggregate_metrics.json", *artifacts.iterdir()]:
        os.utime(p, (old, old))
    os.utime(dpath / "run_aggregate_metrics.json", (old + 1, old + 1))
    return out


def sha256sum_seconds(*files: Path) -> float:
    return best_of(
        lambda: subprocess.run(["sha256sum", *map(str, files)], check=True, capture_output=True), 2
    )


def mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


_SHARED_SERVER: list[Any] = []


@contextlib.contextmanager
def mlflow_server(dpath: Path, tiny: bool) -> Iterator[Any]:
    """A real ``mlflow server`` for one benchmark: its own at full sizes (no neighbour's runs in
    its database); at ``--tiny`` one for the whole harness process, started on first use and
    stopped at exit (each start costs seconds of CPU, and --tiny only checks the harness runs)."""
    from tests.mlflow_server import MlflowServer, free_port

    if not tiny:
        server = MlflowServer(dpath, free_port()).start(timeout=300)
        try:
            yield server
        finally:
            server.stop()
        return
    if not _SHARED_SERVER:
        folder = Path(tempfile.mkdtemp(prefix="gymart-bench-mlflow-"))
        server = MlflowServer(folder, free_port()).start(timeout=300)
        _SHARED_SERVER.append(server)
        atexit.register(lambda: (server.stop(), shutil.rmtree(folder, ignore_errors=True)))
    yield _SHARED_SERVER[0]
