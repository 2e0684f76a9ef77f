"""Test backends registered in-process: one that counts sends, one that must never be built."""

from __future__ import annotations

from typing import ClassVar

from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import ExportPlan, Sent
from gym_artifacts.core.config import ExporterConfig
from gym_artifacts.run.artifacts import RunArtifacts


class CountingExporter(Exporter):
    """Records every send; shares its log across instances so tests can read it."""

    name = "counting"
    sends: ClassVar[list[str]] = []

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        CountingExporter.sends.append(plan.run_identity)
        return Sent(backend_run_id=f"counting-{len(CountingExporter.sends)}", rows=1, bytes=1)


class ExplodingExporter(Exporter):
    """Fails loudly as soon as anything builds it: SKIPPED must never get that far."""

    name = "exploding"

    def __init__(self, settings: ExporterConfig) -> None:
        raise AssertionError("the exploding backend was built")

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        raise AssertionError("the exploding backend was contacted")


class CrashingExporter(Exporter):
    """A backend with a bug: raises something that is not an expected failure."""

    name = "crashing"

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        raise ZeroDivisionError("backend bug")


# -- hostile live backends ------------------------------------------------------------------------
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from gym_artifacts.contract.hooks import RunStatus  # noqa: E402
from gym_artifacts.contract.live_exporter import LiveExporter  # noqa: E402


class RecordingLive(LiveExporter):
    """A well-behaved live backend that keeps what it received in memory."""

    name = "recording"
    received: ClassVar[list[tuple[str, Any]]] = []

    def _setup(self) -> str:
        RecordingLive.received.append(("setup", self.resume_run_id))
        return self.resume_run_id or f"rec-{len(RecordingLive.received)}"

    def _log_config(self, config: dict[str, Any]) -> None:
        RecordingLive.received.append(("config", config))

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        RecordingLive.received.append(("metrics", (step, metrics)))

    def _log_rollouts(self, rollouts: list[Any]) -> None:
        RecordingLive.received.append(("rollouts", rollouts))

    def _teardown(self, status: RunStatus) -> None:
        RecordingLive.received.append(("teardown", status))

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        return Sent("rec-post")


class SleepyLive(RecordingLive):
    """Every metrics call takes two seconds."""

    name = "sleepy"

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        time.sleep(2)


class FailingLive(RecordingLive):
    """Every call after setup raises."""

    name = "failing"
    calls: ClassVar[int] = 0

    def _log_config(self, config: dict[str, Any]) -> None:
        FailingLive.calls += 1
        raise ConnectionError("tracker is down")

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        FailingLive.calls += 1
        raise ConnectionError("tracker is down")

    def _teardown(self, status: RunStatus) -> None:
        raise ConnectionError("tracker is down")


class BrokenSetupLive(RecordingLive):
    """Cannot even open a run."""

    name = "brokensetup"

    def _setup(self) -> str:
        raise PermissionError("invalid API key")


class HangingTeardownLive(RecordingLive):
    """Its teardown never returns (until the test process ends)."""

    name = "hanging"
    release = threading.Event()

    def _teardown(self, status: RunStatus) -> None:
        HangingTeardownLive.release.wait(3600)


HOSTILE = (SleepyLive, FailingLive, BrokenSetupLive, HangingTeardownLive)


class UnansweringLive(RecordingLive):
    """A tracker that stopped answering after setup: metric calls pile up behind the first one."""

    name = "unanswering"
    release = threading.Event()

    def _log_metrics(self, metrics: dict[str, Any], step: int, timestamp: float) -> None:
        UnansweringLive.release.wait(3600)

    def _log_metrics_batch(self, entries: list[tuple[dict[str, Any], int, float]]) -> None:
        UnansweringLive.release.wait(3600)
