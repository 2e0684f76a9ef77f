"""Issue 42 (14): once an export's deadline has failed it, nothing it abandoned speaks again.

An export to a server that accepts and never answers, with a short deadline and MLflow's
transport retries on: the deadline abandons the send (its sockets shut down, new connections
refused), and the abandoned request's urllib3 retries would each log "Retrying (Retry(...))
after connection broken by ..." after the result was already reported. Those lines belong to
work we gave up: none may be logged once the result is out."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.load import scaled
from tests.reliability.faulty_servers import black_hole

pytest.importorskip("mlflow")


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[float, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record))


@pytest.mark.slow
def test_no_retry_warning_after_the_deadline_failed_the_export(quickstart_run: Path) -> None:
    recorder = Recorder()
    root = logging.getLogger()
    root.addHandler(recorder)
    try:
        with black_hole() as hole:
            cfg = {"exporters": {"mlflow": {
                "enabled": True, "tracking_uri": hole.uri, "export_deadline": 3, "export_request_timeout": 1,
                "export_request_retries": 5, "report": "off",
            }}}  # fmt: skip
            [result] = export_run(quickstart_run, cfg, exporters=["mlflow"])
            reported = time.monotonic()
            assert result.status is ExportStatus.FAILED and "deadline" in (result.reason or ""), result
            # the abandoned requests end on their refused connections (each retry refused at once)
            bound = time.monotonic() + scaled(20)
            while time.monotonic() < bound and any(
                t.name.startswith("gym-artifacts-mlflow") and t.is_alive() for t in threading.enumerate()
            ):
                time.sleep(0.1)
    finally:
        root.removeHandler(recorder)
    after = [r.getMessage() for t, r in recorder.records if t > reported and r.name.startswith("urllib3")]
    assert not after, after[:3]
