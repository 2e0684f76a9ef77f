"""Live logging: never slows or fails the eval, whatever the backend does."""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import RunStatus
from gym_artifacts.live import live_exporters
from gym_artifacts.live.fanout import LiveRun, NoOpLiveRun, live_run
from gym_artifacts.live.worker import BackgroundWorker, Call
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker
from tests.backends import HOSTILE, FailingLive, HangingTeardownLive, RecordingLive
from tests.load import scaled


@pytest.fixture(autouse=True)
def _live_backends() -> Iterator[None]:
    for cls in (RecordingLive, *HOSTILE):
        registry.register(cls)
    RecordingLive.received.clear()
    FailingLive.calls = 0
    yield
    HangingTeardownLive.release.set()
    HangingTeardownLive.release = type(HangingTeardownLive.release)()
    for cls in (RecordingLive, *HOSTILE):
        registry.unregister(cls.name)


def config(store: Path, *names: str, resume: bool = False) -> dict:
    exporters = {"local": {"enabled": True, "root": str(store), "experiment": "live"}}
    exporters.update({n: {"enabled": True} for n in names})
    return {
        "exporters": exporters,
        "resume": resume,
        "wandb_api_key": "sk-live-canary-123456",
        "policy": {"base_url": "http://x", "api_key": "sk-live-canary-123456"},
    }


def local_run_dpath(store: Path, run: Path) -> Path:
    marker = read_marker(RunArtifacts.from_path(run).run_id_marker_fpath("local"))
    assert marker is not None
    return store / "live" / marker.run_id


def local_steps(store: Path, run: Path) -> list[int]:
    lines = (local_run_dpath(store, run) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize("hostile", ["sleepy", "failing", "brokensetup", "hanging"])
def test_hostile_backend_never_slows_or_fails_the_eval(tmp_path: Path, hostile: str) -> None:
    store = tmp_path / "store"
    out = tmp_path / "out" / "eval.jsonl"
    costs = []
    start = time.monotonic()
    with live_run(config(store, hostile), out, teardown_timeout=3.0) as live:
        assert isinstance(live, LiveRun)
        for step in range(200):
            t0 = time.perf_counter()
            live.export_metrics({"loss": 1.0 / (step + 1), "reward": step % 2}, step=step)
            costs.append(time.perf_counter() - t0)
        live.export_rollouts([{"id": i} for i in range(5)])
    elapsed = time.monotonic() - start
    reports = {r.exporter: r for r in live.reports}
    # The caller's cost: microseconds, whatever the backend does (a blocking call would be >= 2 s).
    assert statistics.median(costs) < 100e-6, statistics.median(costs)
    assert sorted(costs)[int(len(costs) * 0.95)] < 1e-3
    assert max(costs) < 0.5  # a blocking call would take the backend's 2 s
    assert elapsed < 3.0 + scaled(2.0)  # teardown kept its deadline
    # The other backend received everything.
    assert local_steps(store, out) == list(range(200))
    assert reports["local"].lost == 0 and reports["local"].teardown_finished
    assert json.loads((local_run_dpath(store, out) / "run.json").read_text())["status"] == "FINISHED"
    hostile_report = reports[hostile]
    if hostile == "sleepy":
        assert hostile_report.undelivered + hostile_report.dropped > 0
    if hostile == "failing":
        assert hostile_report.failed >= 1 and "tracker is down" in (hostile_report.last_error or "")
    if hostile == "brokensetup":
        assert "invalid API key" in (hostile_report.setup_error or "")
    if hostile == "hanging":
        assert not hostile_report.teardown_finished


def test_failing_backend_is_backed_off_and_logged_once_per_burst(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with live_run(
        config(tmp_path / "s", "failing"), tmp_path / "eval.jsonl", teardown_timeout=1.0
    ) as live:
        for step in range(500):
            live.export_metrics({"x": step}, step=step)
        time.sleep(1.0)
    # Backed off: far fewer attempts than calls, no tight retry loop.
    assert 1 <= FailingLive.calls < 20
    burst_logs = [r for r in caplog.records if "failed (ConnectionError" in r.getMessage()]
    assert len(burst_logs) == 1


def test_journal_keeps_every_step_when_every_backend_fails(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"failing": {"enabled": True}, "brokensetup": {"enabled": True}}}
    before = time.time()
    with live_run(cfg, out, teardown_timeout=1.0) as live:
        for step in range(100):
            live.export_metrics({"reward": step / 100}, step=step)
    lines = [json.loads(line) for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(100))
    assert all(before <= line["time"] <= time.time() for line in lines)
    assert lines[42]["metrics"] == {"reward": 0.42}


def test_the_old_name_live_exporters_still_opens_the_same_live_run_and_says_it_is_deprecated(
    tmp_path: Path,
) -> None:
    """``live_exporters`` (public before it was named for what it yields) keeps working: the same
    arguments give a LiveRun that journals every step, with a DeprecationWarning naming ``live_run``."""
    out = tmp_path / "eval.jsonl"
    with pytest.warns(DeprecationWarning, match=r"use gym_artifacts\.live\.live_run\(\)"):
        opened = live_exporters(config(tmp_path / "s", "recording"), out, teardown_timeout=3.0)
    with opened as live:
        assert isinstance(live, LiveRun)
        live.export_metrics({"reward": 0.5}, step=7)
    lines = [json.loads(line) for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert [(line["step"], line["metrics"]) for line in lines] == [(7, {"reward": 0.5})]


def test_secrets_masked_before_log_config(tmp_path: Path) -> None:
    with live_run(config(tmp_path / "s", "recording"), tmp_path / "eval.jsonl"):
        pass
    [cfg] = [payload for kind, payload in RecordingLive.received if kind == "config"]
    assert cfg["policy"]["api_key"] == "***"
    assert "wandb_api_key" not in cfg and "exporters" not in cfg  # the tool's settings are no params
    assert "sk-live-canary-123456" not in json.dumps(cfg)
    assert (
        "sk-live-canary-123456"
        not in (local_run_dpath(tmp_path / "s", tmp_path / "eval.jsonl") / "config.json").read_text()
    )


def test_failed_eval_ends_run_failed(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    with pytest.raises(RuntimeError), live_run(config(tmp_path / "s"), out) as live:
        live.export_metrics({"x": 1})
        raise RuntimeError("eval crashed")
    assert json.loads((local_run_dpath(tmp_path / "s", out) / "run.json").read_text())["status"] == "FAILED"


def test_other_ranks_get_a_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    with live_run(config(tmp_path / "s"), tmp_path / "eval.jsonl") as live:
        assert isinstance(live, NoOpLiveRun)
        live.export_metrics({"x": 1}, step=0)
        live.export_rollouts([{}])
        live.complete()
    assert not (tmp_path / "s").exists()
    assert not (tmp_path / "eval_metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("env", "declared", "rank_zero"),
    [
        ({"SLURM_PROCID": "5"}, None, False),  # srun, one task per GPU
        ({"SLURM_PROCID": "0", "RANK": "9"}, None, False),  # torchrun inside one srun task
        ({"SLURM_PROCID": "0"}, None, True),
        ({"RANK": "4"}, 0, True),  # the caller knows better than the environment
        ({}, 2, False),
    ],
)
def test_rank_from_slurm_and_from_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], declared: int | None, rank_zero: bool
) -> None:
    from gym_artifacts.core.ranks import set_rank

    for var, value in env.items():
        monkeypatch.setenv(var, value)
    set_rank(declared)
    with live_run(config(tmp_path / "s"), tmp_path / "eval.jsonl") as live:
        live.export_metrics({"x": 1}, step=0)
    assert isinstance(live, NoOpLiveRun) is not rank_zero
    assert (tmp_path / "eval_metrics.jsonl").exists() is rank_zero


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True])
def test_declared_rank_must_be_a_rank(bad: object) -> None:
    from gym_artifacts.core.ranks import set_rank

    with pytest.raises(ValueError, match="rank must be a non-negative integer"):
        set_rank(bad)  # type: ignore[arg-type]


def test_malformed_rank_is_rank_zero_with_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "zero")
    with live_run(config(tmp_path / "s"), tmp_path / "eval.jsonl") as live:
        assert isinstance(live, LiveRun)
    assert any("LOCAL_RANK='zero' is not an integer" in r.getMessage() for r in caplog.records)


def test_overflow_drops_metrics_first_never_config_or_rollouts() -> None:
    worker = BackgroundWorker("t", max_queued=10)
    applied: list[str] = []
    gate = __import__("threading").Event()
    worker.submit(Call(gate.wait, (5,), "block"))
    for i in range(50):
        worker.submit(Call(applied.append, (f"m{i}",), "metrics", droppable=True))
    worker.submit(Call(applied.append, ("config",), "config"))
    worker.submit(Call(applied.append, ("rollouts",), "rollouts"))
    gate.set()
    assert worker.stop(5)
    assert "config" in applied and "rollouts" in applied
    assert worker.stats.dropped == worker.stats.dropped_kinds["metrics"] > 0
    assert applied[-2:] == ["config", "rollouts"]  # order kept


def test_calls_in_a_forked_child_never_hang(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    with live_run(config(tmp_path / "s"), out) as live:
        live.export_metrics({"x": 0}, step=0)
        pid = os.fork()
        if pid == 0:  # child: the worker threads are gone; calls must return at once
            try:
                live.export_metrics({"x": 1}, step=1)
                live.flush(1.0)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        live.export_metrics({"x": 2}, step=2)
    assert local_steps(tmp_path / "s", out) == [0, 2]


def test_teardown_status_killed_on_interrupt(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    with pytest.raises(KeyboardInterrupt), live_run(config(tmp_path / "s", "recording"), out):
        raise KeyboardInterrupt
    assert ("teardown", RunStatus.KILLED) in RecordingLive.received


def test_flush_of_a_stopping_worker_waits_for_its_drain_not_its_timeout() -> None:
    worker = BackgroundWorker("t")
    done: list[int] = []
    worker.submit(Call(lambda: (time.sleep(0.2), done.append(1)), (), "slow"))
    worker.stop(0)  # asks to stop and returns at once
    started = time.monotonic()
    assert worker.flush(5.0)
    assert done == [1] and time.monotonic() - started < scaled(2.0)


def test_queued_metric_calls_are_applied_as_batches_in_order() -> None:
    applied: list[list[int]] = []
    gate = __import__("threading").Event()

    def single(value: int) -> None:
        applied.append([value])

    def batch(args: list[tuple[int]]) -> None:
        applied.append([a[0] for a in args])

    worker = BackgroundWorker("t")
    worker.submit(Call(gate.wait, (5,), "block"))
    for i in range(10):
        worker.submit(Call(single, (i,), "metrics", True, batch))
    worker.submit(Call(single, (99,), "config"))
    for i in range(10, 13):
        worker.submit(Call(single, (i,), "metrics", True, batch))
    gate.set()
    assert worker.stop(5)
    assert applied == [list(range(10)), [99], [10, 11, 12]]
    assert worker.stats.delivered == 1 + 10 + 1 + 3


def test_automatic_steps_from_several_threads_are_unique_and_in_order(tmp_path: Path) -> None:
    import sys
    import threading

    threads, calls = 4, 2_500
    out = tmp_path / "run" / "eval.jsonl"
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave as often as the interpreter lets them
    try:
        with live_run(config(tmp_path / "store", "recording"), out) as live:
            assert isinstance(live, LiveRun)

            def log() -> None:
                for _ in range(calls):
                    live.export_metrics({"loss": 0.5})

            workers = [threading.Thread(target=log, daemon=True) for _ in range(threads)]
            for t in workers:
                t.start()
            for t in workers:
                t.join(120)
            assert not any(t.is_alive() for t in workers), "a logging thread hung"
    finally:
        sys.setswitchinterval(switch)
    journal = [json.loads(line)["step"] for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert journal == sorted(set(journal)), "duplicate or out-of-order steps in the journal"
    assert len(journal) + live.journal_lost == threads * calls
    received = [step for kind, (step, _) in [r for r in RecordingLive.received if r[0] == "metrics"]]
    assert received == sorted(set(received)), "duplicate or out-of-order steps at the backend"
    assert local_steps(tmp_path / "store", out) == sorted(set(local_steps(tmp_path / "store", out)))


def test_calls_after_teardown_are_counted_late_sent_nowhere_and_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, out = tmp_path / "store", tmp_path / "run" / "eval.jsonl"
    with live_run(config(store, "recording"), out) as live:
        assert isinstance(live, LiveRun)
        live.export_metrics({"loss": 1.0}, step=0)
    received = list(RecordingLive.received)
    with caplog.at_level(logging.WARNING, logger="gym_artifacts"):
        live.export_metrics({"loss": 2.0}, step=1)
        live.export_metrics({"loss": 2.0})
        live.export_rollouts([{"id": 1}])
        live.export_config({"lr": 0.1})
        live.complete()
        live.start_over()
    assert live.late == 6
    assert RecordingLive.received == received  # no backend saw any of them
    assert local_steps(store, out) == [0]
    journal = [json.loads(line)["step"] for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert journal == [0]
    late_warnings = [r for r in caplog.records if "after teardown" in r.getMessage()]
    assert len(late_warnings) == 1, [r.getMessage() for r in caplog.records]


def test_a_thread_still_logging_during_teardown_loses_no_call_uncounted(tmp_path: Path) -> None:
    import threading

    out = tmp_path / "run" / "eval.jsonl"
    sent = 0
    stop = threading.Event()
    started = threading.Event()

    with live_run(config(tmp_path / "store", "recording"), out) as live:
        assert isinstance(live, LiveRun)

        def log() -> None:
            nonlocal sent
            while not stop.is_set():
                live.export_metrics({"loss": 0.5}, step=sent)
                sent += 1
                if sent == 100:
                    started.set()

        thread = threading.Thread(target=log, daemon=True)
        thread.start()
        assert started.wait(30)
    time.sleep(0.05)  # the thread keeps logging after the block ended
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    journal = out.with_name("eval_metrics.jsonl").read_text().splitlines()
    assert live.late > 0
    assert len(journal) + live.journal_lost + live.late == sent


@pytest.mark.parametrize("failure", ["hangs", "disk-full", "overflows"])
def test_a_journal_that_loses_calls_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    """The journal's disk hangs (calls still queued at the deadline), fills (writes fail), or is
    slower than the calls (its queue overflows): the warning counts the lost calls and gives the
    cause of each kind of loss, never "queue full or disk failing: None"."""
    import errno
    import threading

    from gym_artifacts.live.journal_writer import MetricsJournal

    release = threading.Event()
    real_append, real_init = MetricsJournal._append, MetricsJournal.__init__

    def append(self: MetricsJournal, data: bytes) -> None:
        if failure == "disk-full":
            raise OSError(errno.ENOSPC, "No space left on device")
        release.wait(30)  # a disk that does not answer
        real_append(self, data)

    monkeypatch.setattr(MetricsJournal, "_append", append)
    if failure == "overflows":
        monkeypatch.setattr(MetricsJournal, "__init__", lambda self, *a, **k: real_init(self, *a, **{**k, "max_queued": 5}))
    out = tmp_path / "eval.jsonl"
    caplog.set_level(logging.WARNING, logger="gym_artifacts.live.fanout")
    try:
        with live_run(config(tmp_path / "store"), out, teardown_timeout=0.5) as live:
            for step in range(40):
                live.export_metrics({"reward": step / 40}, step=step)
    finally:
        release.set()
    [warning] = [r.getMessage() for r in caplog.records if "the journal" in r.getMessage()]
    assert "None" not in warning and f"lost {live.journal_lost} metric call(s)" in warning, warning
    cause = {"hangs": "not written before the", "disk-full": "No space left on device", "overflows": "queue"}[failure]
    assert cause in warning, warning
