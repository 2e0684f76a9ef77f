"""The MLflow run's ``report.html`` is off the export's critical path: the run is complete in
MLflow and the receipt written first, and a report that fails, or a process killed while
building it, never fails or undoes the export; a rerun is SKIPPED, one MLflow run."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from tests.mlflow_store import mlflow_sqlite
from tests.reliability.test_crash import check_receipt, killed

EXPERIMENT = "report"


@pytest.fixture(autouse=True)
def _own_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An experiment of each test's own (the session's mlflow server is shared between tests)."""
    monkeypatch.setattr(sys.modules[__name__], "EXPERIMENT", f"report-{uuid.uuid4().hex[:12]}")


def _cfg(uri: str, report: object) -> Any:
    return OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri,
                                  "experiment_name": EXPERIMENT, "report": report}}}
    )  # fmt: skip


def _runs(uri: str) -> list[Any]:
    """Every run of the experiment, deleted ones too."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return list(client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL))


def _artifacts(uri: str, run_id: str) -> set[str]:
    from mlflow.tracking import MlflowClient

    return {f.path for f in MlflowClient(uri).list_artifacts(run_id)}


def _assert_one_complete_run(uri: str, run: RunArtifacts, backend_run: str) -> None:
    """Exactly one MLflow run, FINISHED, tagged complete, holding the run's rollouts whole."""
    from mlflow.tracking import MlflowClient

    [only] = _runs(uri)
    assert only.info.run_id == backend_run and only.info.lifecycle_stage == "active"
    assert only.info.status == "FINISHED"
    assert bookkeeping_of(only.data.tags)["complete"] == "true"
    assert bookkeeping_of(only.data.tags)["identity"]
    dl = Path(MlflowClient(uri).download_artifacts(backend_run, "rollouts/rollouts.jsonl", str(run.stem.parent / "dl")))
    assert dl.read_bytes() == run.rollouts_fpath.read_bytes()  # type: ignore[union-attr]


def test_report_failure_never_fails_the_mlflow_export(
    quickstart_run: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gym_artifacts.report

    def broken(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("matplotlib exploded")

    monkeypatch.setattr(gym_artifacts.report, "build_report", broken)
    run = RunArtifacts.from_path(quickstart_run)
    [result] = export_run(run, _cfg(tracking_uri, "after"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert check_receipt(run, "mlflow") == result.backend_run_id
    _assert_one_complete_run(tracking_uri, run, result.backend_run_id)
    artifacts = _artifacts(tracking_uri, result.backend_run_id)
    assert "report.html" not in artifacts and "report.html.error" in artifacts  # why, where users look
    [again] = export_run(run, _cfg(tracking_uri, "after"))
    assert again.status is ExportStatus.SKIPPED and again.backend_run_id == result.backend_run_id
    assert len(_runs(tracking_uri)) == 1


def test_report_is_built_after_the_run_is_complete_and_the_receipt_written(
    quickstart_run: Path, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gym_artifacts.report.build as build

    run = RunArtifacts.from_path(quickstart_run)
    seen: list[tuple[bool, list[Any]]] = []
    real = build.render_page

    def watched(*args: object, **kwargs: object) -> Any:
        receipt = run.export_done_fpath("mlflow").is_file()
        seen.append((receipt, [bookkeeping_of(r.data.tags).get("complete") for r in _runs(tracking_uri)]))
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "render_page", watched)
    [result] = export_run(run, _cfg(tracking_uri, "after"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert seen == [(True, ["true"])]  # one build, once the result was recorded
    from mlflow.tracking import MlflowClient

    page = Path(MlflowClient(tracking_uri).download_artifacts(result.backend_run_id, "report.html",
                                                              str(quickstart_run.parent / "dl")))  # fmt: skip
    assert page.read_text().rstrip().endswith("</html>")
    assert "report.html.error" not in _artifacts(tracking_uri, result.backend_run_id)


@pytest.mark.slow
def test_mlflow_export_killed_while_building_the_report_keeps_run_and_receipt(
    quickstart_run: Path, tmp_path: Path
) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    argv = ["cli", "export", str(quickstart_run), "-e", "mlflow", f"exporters.mlflow.tracking_uri={uri}",
            f"exporters.mlflow.experiment_name={EXPERIMENT}", "exporters.mlflow.report=after"]  # fmt: skip
    killed("gym_artifacts.report.build:render_page", 1, "before", argv, {"MLFLOW_DISABLE_TELEMETRY": "true"})
    run = RunArtifacts.from_path(quickstart_run)
    backend_run = check_receipt(run, "mlflow")  # written before the report was started
    _assert_one_complete_run(uri, run, backend_run)
    assert "report.html" not in _artifacts(uri, backend_run)
    [again] = export_run(run, _cfg(uri, "after"))
    assert again.status is ExportStatus.SKIPPED and again.backend_run_id == backend_run
    assert len(_runs(uri)) == 1


def _report_processes(run_id: str) -> list[int]:
    """Pids of background MLflow report builds of ``run_id`` (their command line names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"_mlflow_report" in a for a in argv) and any(run_id.encode() in a for a in argv):
            pids.append(int(entry.name))
    return pids


def _wait_until(check: object, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_background_report_reaches_the_run_after_the_export_returns(quickstart_run: Path, tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    run = RunArtifacts.from_path(quickstart_run)
    [result] = export_run(run, _cfg(uri, "background"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert check_receipt(run, "mlflow") == result.backend_run_id
    _assert_one_complete_run(uri, run, result.backend_run_id)
    _wait_until(lambda: "report.html" in _artifacts(uri, result.backend_run_id)
                and not _report_processes(result.backend_run_id))  # fmt: skip
    assert "report.html.error" not in _artifacts(uri, result.backend_run_id)


@pytest.mark.slow
def test_background_report_killed_leaves_the_mlflow_export_whole(quickstart_run: Path, tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    run = RunArtifacts.from_path(quickstart_run)
    [result] = export_run(run, _cfg(uri, "background"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    for pid in _report_processes(result.backend_run_id):
        os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not _report_processes(result.backend_run_id))
    assert check_receipt(run, "mlflow") == result.backend_run_id
    _assert_one_complete_run(uri, run, result.backend_run_id)
    [again] = export_run(run, _cfg(uri, "background"))
    assert again.status is ExportStatus.SKIPPED and again.backend_run_id == result.backend_run_id
    assert len(_runs(uri)) == 1


@pytest.mark.parametrize("off", ["off", False])  # YAML and the CLI read a bare `off` as False
def test_report_off_uploads_none(quickstart_run: Path, tmp_path: Path, off: object) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    [result] = export_run(quickstart_run, _cfg(uri, off))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert not {"report.html", "report.html.error"} & _artifacts(uri, result.backend_run_id)


def test_report_choices_are_the_local_backends(quickstart_run: Path, tmp_path: Path) -> None:
    from gym_artifacts._builtin_exporters.local import LocalSettings
    from gym_artifacts._builtin_exporters.mlflow import MlflowSettings

    assert MlflowSettings.model_fields["report"].annotation == LocalSettings.model_fields["report"].annotation
    [result] = export_run(quickstart_run, _cfg(mlflow_sqlite(tmp_path / 'm.db'), "sometimes"))
    assert result.status is ExportStatus.FAILED
    assert "exporters.mlflow.report" in (result.reason or "")
