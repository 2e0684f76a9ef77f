"""What one NeMo Gym exporter call costs the eval: NeMo Gym 0.7.0's own exporters beside
gym-artifacts' drop-in, the same calls into the same real ``mlflow server`` and W&B offline.

Run with NeMo Gym's venv (``scripts/nemo_gym_env.sh``), an ``mlflow server`` up at URI::

    .venv-nemo-gym/bin/python -m benchmarks.nemo_gym_calls --mlflow URI --out DIR [--kill-pid PID]

It times, for each module, ``setup_exporters``, ``export_metrics`` (a step of NeMo Gym's
``progress/*`` metrics, 20 times), ``export_rollouts`` (10 real NeMo Gym 0.7.0 rollout lines)
and ``teardown_exporters``, in the calling thread (what the eval waits for). With ``--kill-pid``
(the mlflow server's process group), it kills the server after setup and times the calls with
the server gone, within ``--kill-budget`` seconds in all (NeMo Gym's MLflow client retries each
call for minutes: the calls not reached within it are left out). Prints one JSON object per module.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROLLOUTS = Path(__file__).resolve().parent.parent / "tests/fixtures/nemo-gym-0.7.0/clean/rollouts.jsonl"


def config(module: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.out) / module.replace(".", "-")
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "output_jsonl_fpath": str(folder / "OUT.jsonl"),
        "results_dir": str(folder / "results"),
        "mlflow_tracking_uri": args.mlflow,
        "mlflow_experiment_name": f"calls-{module}",
        "mlflow_run_name": "calls",
        "wandb_project": "calls",
        "wandb_name": "calls",
        "wandb_api_key": "k" * 40,
    }


def timed(fn: Any, *a: Any, budget: float | None = None) -> float:
    """Milliseconds ``fn(*a)`` held the caller (at most ``budget`` s: then the budget is returned)."""
    if budget is None:
        started = time.perf_counter()
        fn(*a)
        return (time.perf_counter() - started) * 1000
    done = threading.Event()
    started = time.perf_counter()

    def call() -> None:
        with contextlib.suppress(Exception):
            fn(*a)
        done.set()

    threading.Thread(target=call, daemon=True).start()
    done.wait(budget)
    return (time.perf_counter() - started) * 1000


def measure(module_name: str, args: argparse.Namespace) -> dict[str, Any]:
    from omegaconf import OmegaConf

    module = importlib.import_module(module_name)
    rows = [json.loads(line) for line in ROLLOUTS.read_text().splitlines()]
    cfg = OmegaConf.create(config(module_name, args))
    result: dict[str, Any] = {"module": module_name}
    result["setup_ms"] = timed(module.setup_exporters, cfg)
    result["backends"] = sorted(type(e).__name__ for e in module.get_exporters())
    if args.kill_pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(args.kill_pid, signal.SIGKILL)
        time.sleep(1)
    deadline = time.monotonic() + args.kill_budget if args.kill_pid else None

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    started = time.monotonic()
    metrics_ms: list[float] = []
    for step in range(1, 21):
        metrics = {"progress/total/rollouts_per_min": 100.0 + step, "progress/agent/reward": 50.0}
        metrics_ms.append(timed(module.export_metrics, metrics, step * 10, budget=left()))
        if left() == 0.0:
            break
    result["export_metrics_ms"] = {
        "calls": len(metrics_ms), "median": statistics.median(metrics_ms), "max": max(metrics_ms),
    }  # fmt: skip
    if left() != 0.0:
        result["export_rollouts_ms"] = timed(module.export_rollouts, rows, budget=left())
    if left() != 0.0:
        result["teardown_ms"] = timed(module.teardown_exporters, budget=left())
    result["held_s_total"] = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mlflow", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--module", choices=["nemo_gym.exporters", "gym_artifacts.nemo_gym"], required=True)
    parser.add_argument("--kill-pid", type=int, default=0)
    parser.add_argument("--kill-budget", type=float, default=300.0)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    print(json.dumps(measure(args.module, args)), flush=True)
    sys.stdout.flush()
    os._exit(0)  # a module whose calls still hang on a dead server: do not wait for them at exit


if __name__ == "__main__":
    main()
