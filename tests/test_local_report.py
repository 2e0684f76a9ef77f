"""The local backend's report is off the export's critical path: the data files and the receipt
are published first, and a report that fails, or a process killed while building it, never
fails or undoes the export."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from tests.reliability.test_crash import check_receipt, killed


def _cfg(store: Path, report: object) -> object:
    return OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store), "report": report}}})


def _assert_data_published(run: RunArtifacts, folder: Path) -> None:
    """Every data file is the run's whole content, and run.json says FINISHED."""
    assert json.loads((folder / "run.json").read_text())["status"] == "FINISHED"
    assert (folder / "rollouts.jsonl").read_bytes() == run.rollouts_fpath.read_bytes()  # type: ignore[union-attr]
    for src in run.artifacts_dpath.iterdir():
        assert (folder / "artifacts" / src.name).read_bytes() == src.read_bytes(), src.name
    journal = run.metrics_journal_fpath.read_text().splitlines()
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == len(journal)
    assert (folder / "summary.json").is_file() and (folder / "config.json").is_file()


def _report_whole_or_absent(folder: Path) -> None:
    report = folder / "report.html"
    if report.exists():
        assert report.read_text().rstrip().endswith("</html>")
    assert not [p for p in folder.iterdir() if p.name.startswith(".gymart-tmp")]


def test_report_failure_never_fails_the_export(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gym_artifacts.report

    def broken(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("matplotlib exploded")

    monkeypatch.setattr(gym_artifacts.report, "build_report", broken)
    run = RunArtifacts.from_path(quickstart_run)
    [result] = export_run(run, _cfg(tmp_path / "store", "after"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert check_receipt(run, "local") == result.backend_run_id
    folder = tmp_path / "store" / "default" / result.backend_run_id
    _assert_data_published(run, folder)
    assert not (folder / "report.html").exists()
    assert (folder / "report.html.error").read_text() == "RuntimeError: matplotlib exploded\n"
    # built again by hand once the cause is gone: the report, and no stale word of a failure
    monkeypatch.undo()
    from gym_artifacts.cli import main

    assert main(["report", str(quickstart_run), "-o", str(folder / "report.html")]) == 0
    assert (folder / "report.html").is_file() and not (folder / "report.html.error").exists()


@pytest.mark.slow
def test_export_killed_while_building_the_report_keeps_data_and_receipt(
    quickstart_run: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    argv = ["cli", "export", str(quickstart_run), "-e", "local", f"exporters.local.root={store}",
            "exporters.local.report=after"]  # fmt: skip
    killed("gym_artifacts.report.build:render_page", 1, "before", argv)
    run = RunArtifacts.from_path(quickstart_run)
    backend_run = check_receipt(run, "local")  # written before the report was started
    [folder] = (store / "default").iterdir()
    assert folder.name == backend_run
    _assert_data_published(run, folder)
    _report_whole_or_absent(folder)
    assert not (folder / "report.html").exists()
    [again] = export_run(run, _cfg(store, "after"))
    assert again.status is ExportStatus.SKIPPED and again.backend_run_id == backend_run


def _report_processes(dest: Path) -> list[int]:
    """Pids of background report builds for ``dest`` (their command line names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gym_artifacts.report.deferred" in argv and os.fsencode(dest) in argv:
            pids.append(int(entry.name))
    return pids


def _wait_until(check: object, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_background_report_killed_leaves_the_export_whole(quickstart_run: Path, tmp_path: Path) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    store = tmp_path / "store"
    [result] = export_run(run, _cfg(store, "background"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    folder = store / "default" / result.backend_run_id
    assert check_receipt(run, "local") == result.backend_run_id  # before the report, whatever it does
    _assert_data_published(run, folder)
    for pid in _report_processes(folder / "report.html"):
        os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not _report_processes(folder / "report.html"))
    _report_whole_or_absent(folder)
    _assert_data_published(run, folder)
    [again] = export_run(run, _cfg(store, "background"))
    assert again.status is ExportStatus.SKIPPED


@pytest.mark.slow
def test_background_report_is_written_after_the_export_returns(quickstart_run: Path, tmp_path: Path) -> None:
    [result] = export_run(quickstart_run, _cfg(tmp_path / "store", "background"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    folder = tmp_path / "store" / "default" / result.backend_run_id
    _wait_until(lambda: (folder / "report.html").is_file() and not _report_processes(folder / "report.html"))
    page = (folder / "report.html").read_text()
    assert "<script" in page and 'src="artifacts/recording.mp4"' in page
    assert "local" in page  # the Exports section sees the receipt written before the build
    assert not (folder / "report.html.error").exists()
    assert json.loads((folder / "run.json").read_text())["report_built"] == "background"


@pytest.mark.parametrize("off", ["off", False])  # YAML and the CLI read a bare `off` as False
def test_report_off_writes_none(quickstart_run: Path, tmp_path: Path, off: object) -> None:
    [result] = export_run(quickstart_run, _cfg(tmp_path / "store", off))
    folder = tmp_path / "store" / "default" / result.backend_run_id
    assert result.status is ExportStatus.EXPORTED
    assert not (folder / "report.html").exists()
    assert json.loads((folder / "run.json").read_text())["report"] is None


def test_unknown_report_mode_is_refused_naming_the_key(quickstart_run: Path, tmp_path: Path) -> None:
    [result] = export_run(quickstart_run, _cfg(tmp_path / "store", "sometimes"))
    assert result.status is ExportStatus.FAILED
    assert "exporters.local.report" in (result.reason or "")
    assert not (tmp_path / "store").exists()


def test_a_folder_named_like_the_failure_note_never_fails_a_built_report(quickstart_run: Path, tmp_path: Path) -> None:
    """The stale note is removed when it can be; whatever sits under its name (a folder), the
    report that was written is the build's result."""
    from gym_artifacts.report import build_report

    dest = tmp_path / "report.html"
    (tmp_path / "report.html.error").mkdir()
    assert build_report(quickstart_run, dest) == dest and dest.is_file()
