"""Teardown waits while a backend makes progress (idle deadline) up to a hard cap."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gym_artifacts.live.channel import teardown_limits
from gym_artifacts.live.worker import BackgroundWorker, Call
from tests.load import scaled
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent


def test_a_slow_setup_is_waited_for_past_the_idle_deadline() -> None:
    worker = BackgroundWorker("slow-setup")
    got: list[int] = []
    worker.submit(Call(lambda: time.sleep(1.5), (), "setup"))  # longer than the idle deadline
    for i in range(50):
        worker.submit(Call(got.append, (i,), "metrics", droppable=True))
    t0 = time.monotonic()
    assert worker.stop(0.5, hard_cap=30.0)
    assert got == list(range(50)) and worker.stats.undelivered == 0
    assert time.monotonic() - t0 < scaled(10.0)


def test_steady_progress_is_waited_for_until_the_hard_cap() -> None:
    worker = BackgroundWorker("steady")
    for _ in range(100):
        worker.submit(Call(time.sleep, (0.1,), "metrics", droppable=True))  # each call succeeds
    t0 = time.monotonic()
    assert not worker.stop(0.5, hard_cap=1.5)
    elapsed = time.monotonic() - t0
    # past the idle deadline (progress), stopped by the cap, not by the queue's end (100 x 0.1 s)
    assert 1.4 <= elapsed < 1.5 + scaled(5.0)
    assert worker.stats.delivered >= 10  # far more than 0.5 s would have allowed
    assert worker.stats.undelivered > 0


def test_no_progress_ends_at_the_idle_deadline() -> None:
    release = threading.Event()
    worker = BackgroundWorker("hung")
    worker.submit(Call(release.wait, (60,), "metrics", droppable=True))  # a call that never returns
    worker.submit(Call(lambda: None, (), "metrics", droppable=True))
    t0 = time.monotonic()
    assert not worker.stop(0.5, hard_cap=30.0)
    assert time.monotonic() - t0 < scaled(10.0)  # the idle deadline (0.5 s), far from the hard cap (30 s)
    release.set()


def test_limits_come_from_arguments_then_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert teardown_limits() == (10.0, 60.0)
    monkeypatch.setenv("GYM_ARTIFACTS_TEARDOWN_IDLE_S", "3")
    monkeypatch.setenv("GYM_ARTIFACTS_TEARDOWN_MAX_S", "7.5")
    assert teardown_limits() == (3.0, 7.5)
    assert teardown_limits(1, 2) == (1.0, 2.0)
    monkeypatch.setenv("GYM_ARTIFACTS_TEARDOWN_IDLE_S", "soon")
    assert teardown_limits()[0] == 10.0


SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from gym_artifacts.core.config import load_default_config
    from gym_artifacts.live import live_run
    cfg = load_default_config()
    started = time.perf_counter()
    with live_run(cfg, "results/eval.jsonl") as live:
        t0 = time.perf_counter()
        for step in range(1000):
            live.export_metrics({"reward": step / 1000, "loss": 1.0 / (step + 1)}, step=step)
            if step % 100 == 0:
                live.export_rollouts([{"step": step, "reward": 0.5}])
        eval_seconds = time.perf_counter() - t0
    print(json.dumps({"eval_seconds": eval_seconds, "run_seconds": time.perf_counter() - started,
                      "reports": {r.exporter: [r.lost, r.describe()] for r in live.reports}}))
    """
)


@pytest.mark.slow
def test_thousand_step_eval_delivers_every_call_to_a_fresh_sqlite_mlflow(tmp_path: Path) -> None:
    work = tmp_path / "fresh"
    work.mkdir()
    proc = run_bounded(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=work, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    # the eval's calls never waited for MLflow's first use of the SQLite file (its schema, ~10 s):
    # they took a small part of the whole run, teardown included (a ratio in the same run)
    assert result["eval_seconds"] < 0.25 * result["run_seconds"], result
    for lost, described in result["reports"].values():
        assert lost == 0, described
    assert "mlflow" in result["reports"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_sqlite(work / 'mlflow.db'))
    [experiment] = [e for e in client.search_experiments() if e.name == "gym-evals"]
    [run] = client.search_runs([experiment.experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward")] == list(range(1000))
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 1000


def test_a_backend_that_is_down_is_not_waited_for() -> None:
    """A server killed mid-collection: its calls fail one after another (connection refused after
    the client's retries). Teardown does not try the rest until the idle deadline: the eval's
    exit is not held for a backend that is down (the journal keeps every call for the export)."""
    tried: list[int] = []

    def refused(i: int) -> None:
        tried.append(i)
        raise ConnectionRefusedError(111, "Connection refused")

    worker = BackgroundWorker("down")
    for i in range(40):
        worker.submit(Call(refused, (i,), "metrics", droppable=True))
    t0 = time.monotonic()
    worker.stop(20.0, hard_cap=60.0)
    assert time.monotonic() - t0 < 10.0  # far from the 20 s idle deadline
    assert worker.stats.failed + worker.stats.undelivered == 40
    assert len(tried) <= BackgroundWorker.FALLBACK_PROBES + 1


def test_a_backend_that_recovers_is_waited_for_again() -> None:
    """Two failures, then the backend answers again: every later call is delivered."""
    state = {"fail": 2}
    got: list[int] = []

    def flaky(i: int) -> None:
        if state["fail"]:
            state["fail"] -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        got.append(i)

    worker = BackgroundWorker("flaky")
    for i in range(10):
        worker.submit(Call(flaky, (i,), "metrics", droppable=True))
    assert worker.stop(20.0, hard_cap=60.0)
    assert got == list(range(2, 10)) and worker.stats.failed == 2


def test_stop_never_says_all_was_applied_when_calls_were_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stop``'s thread is descheduled a moment after its wait times out at the deadline (a
    loaded machine), and meanwhile the worker gives up the rest of its queue and reaches the stop
    marker: ``stop`` still says not everything was applied, as the undelivered count does."""
    from gym_artifacts.live import worker as worker_module

    class LateWaker(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            done = super().wait(timeout)
            if not done:
                time.sleep(0.3)  # descheduled after the timeout, before looking again
            return done

    class LateStop(worker_module._Stop):
        __slots__ = ()

        def __init__(self) -> None:
            self.done = LateWaker()

    monkeypatch.setattr(worker_module, "_Stop", LateStop)
    worker = BackgroundWorker("race")
    worker.submit(Call(time.sleep, (0.4,), "metrics", droppable=True))  # past the deadline
    for _ in range(200):
        worker.submit(Call(time.sleep, (0,), "metrics", droppable=True))
    applied = worker.stop(0.1, hard_cap=0.1)
    assert worker.stats.undelivered > 0
    assert not applied, (worker.stats.delivered, worker.stats.undelivered)
