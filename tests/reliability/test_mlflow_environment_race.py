"""Issue 42 (14): ``runs/get failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'``.

The cause: MLflow's telemetry keeps its session id in ``os.environ`` and removes it from a
thread of its own (``_set_telemetry_client(None)`` once its config fetch fails or ends, at a
moment no caller chooses: often while an export runs, as after an abandoned one). ``requests``
reads the proxy settings from ``os.environ`` for every request, iterating its keys; a key
removed between the listing and the read is a KeyError, which MLflow reports as the request
failing "with exception '<the key>'". Nothing reached the server: the export must not fail.

The test does what MLflow's telemetry thread does, as often as it can, while real exports to a
real ``mlflow server`` run (each a few dozen requests)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.conftest import copy_quickstart

pytest.importorskip("mlflow")

TELEMETRY_KEY = "_MLFLOW_TELEMETRY_SESSION_ID"


@contextlib.contextmanager
def telemetry_toggling() -> Iterator[Callable[[], int]]:
    """A thread doing what ``mlflow.telemetry.client._set_telemetry_client`` does (set, then
    remove, the session id in ``os.environ``), again and again while the block runs, with
    threads taking turns often (the race is met, not waited for). Yields how many times so far."""
    stop = threading.Event()
    toggles = [0]

    def toggle() -> None:
        while not stop.is_set():
            os.environ[TELEMETRY_KEY] = uuid.uuid4().hex
            os.environ.pop(TELEMETRY_KEY, None)
            toggles[0] += 1

    thread = threading.Thread(target=toggle, daemon=True)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread.start()
    try:
        yield lambda: toggles[0]
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(switching)
        os.environ.pop(TELEMETRY_KEY, None)


def test_an_environment_variable_removed_by_another_thread_never_fails_a_request(mlflow_server: Any) -> None:
    """Requests of the exporter's client (300 runs/get) and a whole export, while another
    thread sets and removes an environment variable: not one fails."""
    from exporters._mlflow_client import RequestLimits, ScopedMlflow

    root = Path(tempfile.mkdtemp(prefix="env-race-"))
    try:
        run = copy_quickstart(root / "runs")
        cfg = {"exporters": {"mlflow": {
            "enabled": True, "tracking_uri": mlflow_server.uri, "report": "off",
            "experiment_name": f"env-race-{uuid.uuid4().hex}",
        }}}  # fmt: skip
        with telemetry_toggling() as toggles:
            [result] = export_run(run, cfg, exporters=["mlflow"])
            assert result.status is ExportStatus.EXPORTED, result.reason
            client = ScopedMlflow(mlflow_server.uri, None, RequestLimits(timeout=30, retries=0, deadline=300))
            failures = []
            for _ in range(300):
                try:
                    client.get_run(result.backend_run_id)
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
            assert toggles() > 1000  # the race was run, not just allowed
        assert not failures, failures[:3]
    finally:
        shutil.rmtree(root, ignore_errors=True)
