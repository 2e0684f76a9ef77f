"""Test backends registered in-process: one that counts sends, one that must never be built."""

from __future__ import annotations

from typing import ClassVar

from gym_artifacts.config import ExporterConfig
from gym_artifacts.exporter import Exporter, ExportPlan, Sent
from gym_artifacts.run import RunArtifacts


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
