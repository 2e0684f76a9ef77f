"""The live split: LiveRun -> LiveChannel -> backend hooks.

A backend written only against the public contract (``gym_artifacts.plugin`` / ``contract/hooks.py``)
runs live end to end; the fan-out reaches a backend only through its channel (no private
method of the backend is touched from ``gym_artifacts.live.fanout``), hooks run only on the channel's
worker thread, and a backend whose hooks hang or raise never blocks or fails the caller.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gym_artifacts import export_run
from gym_artifacts import plugin as ga
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import ExportStatus, LiveHooks, PostRunHooks
from gym_artifacts.live.channel import LiveChannel
from gym_artifacts.live.fanout import LiveRun, live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker, write_marker
from tests.conftest import QUICKSTART

# Every hook name of the contract (required and optional): the only private names a channel may use.
HOOKS = frozenset(
    n for cls in (LiveHooks, PostRunHooks) for n in vars(cls) if n.startswith("_") and not n.startswith("__")
)


class ProbeLive(ga.LiveExporter):
    """A plugin-style backend: public contract only. Records each hook call with its thread and
    every private attribute the core touches, with the module that touched it."""

    name = "probe"
    calls: ClassVar[list[tuple[str, Any, str]]] = []
    touched: ClassVar[list[tuple[str, str]]] = []

    def __getattribute__(self, attr: str) -> Any:
        if attr.startswith("_") and not attr.startswith("__"):
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            if caller.startswith("gym_artifacts"):
                ProbeLive.touched.append((caller, attr))
        return object.__getattribute__(self, attr)

    def _note(self, hook: str, value: Any) -> None:
        ProbeLive.calls.append((hook, value, threading.current_thread().name))

    def _setup(self) -> str:
        self._note("setup", self.resume_run_id)
        return "probe-1"

    def _log_config(self, config: dict[str, Any]) -> None:
        self._note("config", sorted(config))

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        self._note("metrics", step)

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        for _, step, _ in entries:
            self._note("metrics", step)

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        self._note("rollouts", len(rollouts))

    def _teardown(self, status: ga.RunStatus) -> None:
        self._note("teardown", status)

    def _export(self, run: ga.RunArtifacts, plan: ga.ExportPlan) -> ga.Sent:
        self._note("post_run", None)
        return ga.Sent("probe-post")

    def _certify(self, run: ga.RunArtifacts, plan: ga.ExportPlan, live_run_id: str) -> ga.Sent:
        self._note("certify", live_run_id)
        return ga.Sent(live_run_id)

    def _mark_superseded(self, live_run_id: str, new_run_id: str) -> None:
        self._note("superseded", (live_run_id, new_run_id))


class HangingLive(ProbeLive):
    """Opens its run, then never answers again (until released)."""

    name = "hangs"
    release = threading.Event()

    def _setup(self) -> str:
        HangingLive.release.wait(3600)
        return "hung"


class RaisingLive(ProbeLive):
    """Every hook after setup raises something that is not an expected error."""

    name = "raises"

    def _log_config(self, config: dict[str, Any]) -> None:
        raise RuntimeError("config hook bug")

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        raise RuntimeError("metrics hook bug")

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        raise RuntimeError("batch hook bug")

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        raise RuntimeError("rollouts hook bug")

    def _teardown(self, status: ga.RunStatus) -> None:
        raise RuntimeError("teardown hook bug")


@pytest.fixture(autouse=True)
def _probes() -> Iterator[None]:
    for cls in (ProbeLive, HangingLive, RaisingLive):
        registry.register(cls)
    ProbeLive.calls.clear()
    ProbeLive.touched.clear()
    yield
    HangingLive.release.set()
    HangingLive.release = threading.Event()
    for cls in (ProbeLive, HangingLive, RaisingLive):
        registry.unregister(cls.name)


def write_eval_output(out: Path) -> None:
    shutil.copy(QUICKSTART / "eval.jsonl", out)
    shutil.copy(QUICKSTART / "eval_config.yaml", out.with_name(f"{out.stem}_config.yaml"))
    shutil.copy(QUICKSTART / "eval_aggregate_metrics.json", out.with_name(f"{out.stem}_aggregate_metrics.json"))


def probe_eval(out: Path, cfg: dict[str, Any]) -> LiveRun:
    with live_run(cfg, out, teardown_timeout=60) as live:
        assert isinstance(live, LiveRun)
        for step in range(5):
            live.export_metrics({"reward": step / 10}, step=step)
        live.export_rollouts([{"id": 1}, {"id": 2}])
        write_eval_output(out)
        live.complete()
    return live


def test_a_public_contract_backend_runs_live_end_to_end_through_its_channel(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"probe": {"enabled": True}}}
    live = probe_eval(out, cfg)
    [report] = live.reports
    assert (report.run_id, report.lost, report.teardown_finished) == ("probe-1", 0, True)
    assert [type(c) for c in live.channels] == [LiveChannel] and live.channels[0].backend is live.exporters[0]
    hooks = [(hook, value) for hook, value, _ in ProbeLive.calls]
    assert hooks[0] == ("setup", None) and hooks[1][0] == "config"
    assert [v for h, v in hooks if h == "metrics"] == [0, 1, 2, 3, 4]
    assert ("rollouts", 2) in hooks and hooks[-1] == ("teardown", ga.RunStatus.FINISHED)
    # every hook ran on the channel's worker, never on the eval's thread
    assert {thread for _, _, thread in ProbeLive.calls} == {"gym-artifacts-probe"}
    # the fan-out touched no private attribute of the backend; the channel only its hooks
    by_live = [attr for module, attr in ProbeLive.touched if module == "gym_artifacts.live.fanout"]
    assert by_live == []
    not_hooks = {attr for module, attr in ProbeLive.touched if attr not in HOOKS}
    assert not_hooks == set(), not_hooks
    marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath("probe"))
    assert marker is not None and (marker.state, marker.lossless, marker.run_id) == ("completed", True, "probe-1")

    [result] = export_run(out, cfg)  # the post-run algorithm certifies through the backend's hook
    assert (result.status, result.backend_run_id, result.certified) == (ExportStatus.EXPORTED, "probe-1", True)
    assert [h for h, _, _ in ProbeLive.calls][-1] == "certify"

    # The backend never decides: its own export(), called directly, sends a new run, whatever
    # live run lies beside the output.
    exporter = ProbeLive(ProbeLive.config_model())
    direct = exporter.export(RunArtifacts.from_path(out), ga.ExportPlan({}, "b3:x", upload_rollouts=True))
    assert (direct.status, direct.backend_run_id, direct.certified) == (ExportStatus.EXPORTED, "probe-post", False)
    assert [h for h, _, _ in ProbeLive.calls][-1] == "post_run"


CONTEXT = ("run", "resume_run_id", "secrets", "last_step_source", "run_id", "reopened")


class ContextProbe(ProbeLive):
    """Records every assignment of a context attribute after construction, with its thread."""

    name = "context_probe"
    assigned: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        object.__setattr__(self, "constructed", True)

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in CONTEXT and vars(self).get("constructed"):
            ContextProbe.assigned.append((attr, threading.current_thread().name))
        object.__setattr__(self, attr, value)


def test_a_backends_context_is_set_once_per_setup_on_its_worker_thread(tmp_path: Path) -> None:
    registry.register(ContextProbe)
    ContextProbe.assigned.clear()
    try:
        out = tmp_path / "eval.jsonl"
        cfg = {"exporters": {"context_probe": {"enabled": True}}}
        with live_run(cfg, out, teardown_timeout=60) as live:
            live.export_config({"api_key": "sk-secret-value-123456", "lr": 1})
            live.export_metrics({"reward": 1.0}, step=0)
            write_eval_output(out)
            live.complete()
        [report] = live.reports
        assert report.run_id == "probe-1" and report.lost == 0
        threads = {thread for _, thread in ContextProbe.assigned}
        assert threads == {"gym-artifacts-context_probe"}, ContextProbe.assigned  # never the eval's thread
        counts = {attr: [a for a, _ in ContextProbe.assigned].count(attr) for attr in CONTEXT}
        # bound once (bind_live_context); run_id and reopened once more by the setup's outcome
        assert counts == {"run": 1, "resume_run_id": 1, "secrets": 1, "last_step_source": 1, "run_id": 2, "reopened": 2}
        assert ("config", ["api_key", "lr"]) in [(hook, value) for hook, value, _ in ProbeLive.calls]
    finally:
        registry.unregister(ContextProbe.name)


def test_a_live_run_that_lost_calls_is_repaired_by_the_post_run_policy(tmp_path: Path) -> None:
    """Lost calls do not make a second run: the backend's ``_certify`` gets the whole run to
    send what its live run lacks (issue 38)."""
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"probe": {"enabled": True}}}
    probe_eval(out, cfg)
    fpath = RunArtifacts.from_path(out).run_id_marker_fpath("probe")
    marker = read_marker(fpath)
    assert marker is not None
    write_marker(fpath, marker.model_copy(update={"lossless": False, "lost_calls": 3}))
    [result] = export_run(out, cfg)
    assert (result.status, result.backend_run_id) == (ExportStatus.EXPORTED, "probe-1")
    assert [(h, v) for h, v, _ in ProbeLive.calls][-1] == ("certify", "probe-1")


def test_a_live_run_whose_files_differ_is_superseded_by_the_post_run_policy(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"probe": {"enabled": True}}}
    probe_eval(out, cfg)
    with open(out, "a") as fh:  # a rollout the live run never logged, after complete()
        fh.write('{"id": 99}\n')
    fpath = RunArtifacts.from_path(out).run_id_marker_fpath("probe")
    [result] = export_run(out, cfg, certify=True, accept_stale_aggregates=True)
    assert (result.status, result.backend_run_id) == (ExportStatus.EXPORTED, "probe-post"), result.reason
    assert [(h, v) for h, v, _ in ProbeLive.calls][-2:] == [("post_run", None), ("superseded", ("probe-1", "probe-post"))]
    after = read_marker(fpath)
    assert after is not None and after.superseded_by == "probe-post"


def _bounded(fn: Any, seconds: float) -> float:
    """Run ``fn`` on a thread; fail (not hang) when it does not return within ``seconds``."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the caller was blocked for more than {seconds} s"
    assert errors == [], errors
    return time.monotonic() - start


def test_a_hanging_backend_never_blocks_the_caller_of_its_channel(tmp_path: Path) -> None:
    run = RunArtifacts.from_path(tmp_path / "eval.jsonl")
    channel = LiveChannel(HangingLive(HangingLive.config_model()))

    def eval_calls() -> None:
        channel.setup(run)
        channel.export_config({"api_key": "sk-hidden-123456", "lr": 0.1})
        for step in range(500):
            channel.export_metrics({"loss": 0.5}, step)
        channel.export_rollouts([{"id": 1}])
        channel.complete()
        channel.start_over()

    assert _bounded(eval_calls, 10.0) < 10.0
    assert channel.flush(0.2) is False  # the setup still hangs: nothing was applied
    holder: list[Any] = []
    _bounded(lambda: holder.append(channel.teardown(0.3, ga.RunStatus.FINISHED, hard_cap=1.0)), 15.0)
    [report] = holder
    assert report.teardown_finished is False and report.undelivered >= 500 and report.delivered == 0
    assert not run.run_id_marker_fpath("hangs").exists()  # setup never returned: no marker


def test_raising_hooks_become_counted_failures_never_exceptions_for_the_caller(tmp_path: Path) -> None:
    run = RunArtifacts.from_path(tmp_path / "eval.jsonl")
    channel = LiveChannel(RaisingLive(RaisingLive.config_model()))

    def eval_calls() -> None:
        channel.setup(run)
        channel.export_config({"lr": 0.1})
        for step in range(20):
            channel.export_metrics({"loss": 0.5}, step)
        channel.export_rollouts([{"id": 1}])
        channel.complete()

    _bounded(eval_calls, 10.0)
    holder: list[Any] = []
    _bounded(lambda: holder.append(channel.teardown(10.0, ga.RunStatus.FAILED, hard_cap=20.0)), 30.0)
    [report] = holder
    assert report.run_id == "probe-1" and report.failed >= 3 and "hook bug" in (report.last_error or "")
    marker = read_marker(run.run_id_marker_fpath("raises"))
    assert marker is not None and marker.state == "completed" and marker.lossless is False


class DefaultBatchLive(ProbeLive):
    """A plugin without its own batch hook (the default applies the calls one by one) whose
    backend refuses bytes values; its setup waits, so the metric calls queue into one batch."""

    name = "default_batch"
    opened = threading.Event()
    stored: ClassVar[list[int]] = []

    def _setup(self) -> str:
        DefaultBatchLive.opened.wait(30)
        return "default-1"

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        if any(isinstance(v, bytes) for v in metrics.values()):
            raise TypeError("bytes are not a metric")
        DefaultBatchLive.stored.append(step)

    _log_metrics_batch = ga.LiveExporter._log_metrics_batch  # the contract's default


def test_a_failing_call_in_a_default_batch_reaches_the_backend_once_and_is_counted_exactly(
    tmp_path: Path,
) -> None:
    DefaultBatchLive.stored.clear()
    run = RunArtifacts.from_path(tmp_path / "eval.jsonl")
    channel = LiveChannel(DefaultBatchLive(DefaultBatchLive.config_model()))
    channel.setup(run)
    for step in range(8):
        channel.export_metrics({"a": b"x"} if step == 4 else {"a": 1.0}, step)
    DefaultBatchLive.opened.set()  # the 8 calls are queued behind the setup: one batch
    holder: list[Any] = []
    _bounded(lambda: holder.append(channel.teardown(10.0, ga.RunStatus.FINISHED, hard_cap=20.0)), 30.0)
    [report] = holder
    assert DefaultBatchLive.stored == [0, 1, 2, 3, 5, 6, 7]  # each call at most once, in order
    # 7 metric calls + setup + teardown delivered; the poisoned call failed, nothing counted twice
    assert (report.delivered, report.failed, report.lost) == (9, 1, 1), report.describe()
    assert "bytes are not a metric" in (report.last_error or "")
