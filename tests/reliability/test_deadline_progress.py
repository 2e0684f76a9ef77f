"""``export_deadline`` bounds a send that stops making progress, not one that keeps going: the
deadline counts from the export's start and again from each unit of progress the backend reports
(a batch of traces the server took). A 100,000-rollout trace export runs far past 600 s while
every batch lands in seconds; a server that stops answering after some batches still ends the
export ``export_deadline`` after the last one.

In-process (``run_watched`` with a send that reports progress, and one that stalls) and against a
real ``mlflow server`` (trace batches slowed so the export runs twice its deadline; then a batch
that never returns).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.core.watchdog import DeadlinePassed, made_progress, run_watched
from tests.load import scaled

DEADLINE = 1.0
BOUND = 15.0  # generous over the deadline: a loaded 2-core machine stalls threads for seconds


def test_a_send_that_keeps_reporting_progress_outlives_its_deadline() -> None:
    def send() -> str:
        end = time.monotonic() + 3 * DEADLINE
        while time.monotonic() < end:
            time.sleep(DEADLINE / 10)
            made_progress()
        return "sent"

    assert run_watched(send, DEADLINE, "progressing") == "sent"


def test_a_send_that_stalls_after_progress_fails_a_deadline_after_its_last_progress() -> None:
    progressed_until: list[float] = []
    never = threading.Event()

    def send() -> None:
        end = time.monotonic() + 2 * DEADLINE
        while time.monotonic() < end:
            time.sleep(DEADLINE / 10)
            made_progress()
        progressed_until.append(time.monotonic())
        never.wait(60)  # the server that stopped answering

    start = time.monotonic()
    with pytest.raises(DeadlinePassed):
        run_watched(send, DEADLINE, "stalling")
    failed_at = time.monotonic()
    assert failed_at - progressed_until[0] >= DEADLINE * 0.95
    assert failed_at - start < 2 * DEADLINE + BOUND
    never.set()


def test_progress_reported_by_another_send_or_an_unwatched_thread_extends_nothing() -> None:
    """Only the watched send's own threads move its deadline: a thread of another send (or of
    nobody) reporting progress does not keep a stuck send alive."""
    stop = threading.Event()

    def elsewhere() -> None:
        while not stop.is_set():
            made_progress()
            time.sleep(DEADLINE / 20)

    other = threading.Thread(target=elsewhere, daemon=True)
    other.start()
    try:
        start = time.monotonic()
        with pytest.raises(DeadlinePassed):
            run_watched(lambda: stop.wait(60), DEADLINE, "stuck")
        assert time.monotonic() - start < DEADLINE + BOUND
    finally:
        stop.set()


def test_progress_from_no_send_is_a_no_op() -> None:
    made_progress()  # outside any watched send: nothing to extend, nothing raised


def export_traces_in_batches_of_25(quickstart_run: Path, uri: str, experiment: str, deadline: float) -> Any:
    """The quickstart run's 300 rollouts as MLflow traces, 25 a batch, under ``deadline``."""
    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from gym_artifacts._builtin_exporters import _mlflow_traces

    _mlflow_traces.BATCH, batch = 25, _mlflow_traces.BATCH
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": experiment, "log_traces": True,
               "export_deadline": deadline}  # fmt: skip
    try:
        [result] = export_run(quickstart_run, OmegaConf.create({"exporters": {"mlflow": section}}))
    finally:
        _mlflow_traces.BATCH = batch
    return result


@pytest.mark.slow
def test_a_trace_export_longer_than_its_deadline_lands_while_batches_keep_landing(
    quickstart_run: Path, mlflow_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 rollouts as traces in batches of 25, each batch held a sixth of ``export_deadline``
    (12 s on an idle machine, longer in proportion to the load, as every gap between two batches
    is): the trace part alone takes about twice the deadline; the export lands every trace."""
    from mlflow.tracking import MlflowClient

    from gym_artifacts._builtin_exporters.mlflow import ScopedMlflow
    from gym_artifacts.contract.hooks import ExportStatus
    from tests.test_mlflow_traces import all_traces

    real = ScopedMlflow.post_otlp
    deadline = scaled(12)

    def slow_post(self: Any, experiment_id: str, body: bytes) -> Any:
        time.sleep(deadline / 6)
        return real(self, experiment_id, body)

    monkeypatch.setattr(ScopedMlflow, "post_otlp", slow_post)
    start = time.monotonic()
    result = export_traces_in_batches_of_25(quickstart_run, mlflow_server.uri, "progress", deadline)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert time.monotonic() - start > deadline * 1.5  # it did outlive its deadline
    client = MlflowClient(mlflow_server.uri)
    experiment_id = client.get_run(result.backend_run_id).info.experiment_id
    assert len(all_traces(client, experiment_id, result.backend_run_id, spans=False)) == 300


@pytest.mark.slow
def test_a_trace_export_whose_server_stops_answering_fails_a_deadline_after_the_last_batch(
    quickstart_run: Path, own_mlflow_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own server (the abandoned export shuts its sockets down, pooled connections of
    MLflow's process-wide request sessions among them); then an export from the same process to
    the same server lands (it failed on a closed pooled connection before ``_abandon`` dropped
    MLflow's cached sessions)."""

    mlflow_server = own_mlflow_server.start()

    from gym_artifacts._builtin_exporters.mlflow import ScopedMlflow
    from gym_artifacts.contract.hooks import ExportStatus
    from gym_artifacts.run.artifacts import RunArtifacts

    real = ScopedMlflow.post_otlp
    calls: list[float] = []
    never = threading.Event()

    def stops_answering(self: Any, experiment_id: str, body: bytes) -> Any:
        calls.append(time.monotonic())
        if len(calls) == 4:
            never.wait(120)
        return real(self, experiment_id, body)

    monkeypatch.setattr(ScopedMlflow, "post_otlp", stops_answering)
    # a fresh server's first trace batch takes seconds under load: the deadline scales with it
    deadline = scaled(8)
    try:
        result = export_traces_in_batches_of_25(quickstart_run, mlflow_server.uri, "stalled", deadline)
        failed_at = time.monotonic()
    finally:
        never.set()
    assert result.status is ExportStatus.FAILED and "DeadlinePassed" in (result.reason or "")
    assert len(calls) == 4
    assert deadline * 0.95 <= failed_at - calls[3] < deadline + BOUND
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("mlflow").exists()
    # the same process exports again to the same server, once it answers: no closed pooled
    # connection of the abandoned export is reused
    monkeypatch.setattr(ScopedMlflow, "post_otlp", real)
    again = export_traces_in_batches_of_25(quickstart_run, mlflow_server.uri, "after-stall", deadline)
    assert again.status is ExportStatus.EXPORTED, again.reason
