"""The backend contract suite (Lightning's ``test_all`` idea): the same tests for every backend.

Parametrized over every registered exporter (built-in or installed; ``GYM_ARTIFACTS_CONTRACT``
= ``name,name`` narrows it) whose SDK is installed. Each backend runs with the settings its
``contract_settings(folder)`` returns, so all it stores lands in one folder per backend, which
the secrets check then reads byte by byte. Run it with ``python -m gym_artifacts.testing NAME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts import registry
from gym_artifacts.backend import ExportStatus, missing_hooks
from gym_artifacts.export import export_run
from gym_artifacts.live import LiveExporter, LiveRun, live_exporters
from gym_artifacts.receipts import read_marker
from gym_artifacts.run import RunArtifacts
from gym_artifacts.testing.sample_run import (
    ROLLOUTS,
    SECRET_CANARY,
    make_run,
    run_config,
    write_aggregate,
    write_rollouts,
)

SELECT_ENV = "GYM_ARTIFACTS_CONTRACT"
TEARDOWN_DEADLINE_S = 20.0
CERTIFIED_NOTE = "certified the live run"


def contract_exporters() -> list[str]:
    """The backends under test: the selection, else every registered one."""
    chosen = os.environ.get(SELECT_ENV, "")
    names = [n.strip() for n in chosen.split(",") if n.strip()] or sorted(registry.discover())
    return names


@pytest.fixture(autouse=True)
def contract_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing lands in $HOME or the working folder, nothing phones home."""
    monkeypatch.chdir(tmp_path)
    for var, value in {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "WANDB_MODE": "offline",
                       "WANDB_SILENT": "true"}.items():  # fmt: skip
        monkeypatch.setenv(var, value)
    for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        (tmp_path / var.lower()).mkdir()
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.delenv("WANDB_SERVICE", raising=False)


class Backend:
    """One backend under test: its class, its contained settings, and a run maker."""

    def __init__(self, name: str, store: Path) -> None:
        entry = registry.get_entry(name)
        if not entry.sdk_installed():
            pytest.skip(f"{name}: its SDK ({entry.load().sdk_module}) is not installed")
        self.name = name
        self.cls = entry.load()
        self.store = store
        settings = self.cls.contract_settings(store)
        if settings is None:
            pytest.skip(f"{name}: needs a service; its contract_settings() returned None")
        self.settings: dict[str, Any] = settings

    @property
    def config(self) -> Any:
        from omegaconf import OmegaConf

        return OmegaConf.create({"exporters": {self.name: {"enabled": True, **self.settings}}})

    def run(self, folder: Path) -> tuple[Path, list[dict[str, Any]]]:
        return make_run(folder, self.name, self.settings)

    def live(self, out: Path, *, resume: bool = False) -> Any:
        cfg = run_config(self.name, self.settings) | ({"resume": True} if resume else {})
        return live_exporters(cfg, out, teardown_timeout=TEARDOWN_DEADLINE_S)


@pytest.fixture(scope="module", params=contract_exporters())
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def store(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where one backend keeps everything, across its tests (one database per backend, not per test)."""
    yield tmp_path_factory.mktemp(f"store-{backend_name}")


@pytest.fixture
def backend(backend_name: str, store: Path) -> Backend:
    return Backend(backend_name, store)


def _live_session(backend: Backend, out: Path, records: list[dict[str, Any]], *, complete: bool) -> LiveRun:
    """An eval's live calls: config at entry, five steps of metrics, the rollouts, then complete."""
    started = time.monotonic()
    with backend.live(out) as live:
        assert isinstance(live, LiveRun) and [type(e) for e in live.exporters] == [backend.cls]
        for step in range(5):
            live.export_metrics({"reward": step / 4, "tokens": 100 + step}, step=step)
        live.export_rollouts(records)
        if complete:
            live.complete()
        live.flush(TEARDOWN_DEADLINE_S)
        entered = time.monotonic()
    assert time.monotonic() - entered <= TEARDOWN_DEADLINE_S + 2, "teardown outlived its deadline"
    assert time.monotonic() - started < 120
    return live


def test_class_keeps_the_contract(backend: Backend) -> None:
    assert missing_hooks(backend.cls) == []
    assert backend.cls.name == backend.name
    backend.cls.config_model.model_validate({"enabled": True, **backend.settings})
    with pytest.raises(Exception, match=r"(?i)extra|not permitted"):
        backend.cls.config_model.model_validate({"enabled": True, "surely_not_a_setting": 1})


def test_export_skip_and_change(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exported once; the same content again SKIPPED without contacting the backend; a change detected."""
    out, records = backend.run(tmp_path / "run")
    [first] = export_run(out, backend.config)
    assert first.status is ExportStatus.EXPORTED, first.reason
    assert first.backend_run_id and first.rows == ROLLOUTS

    calls: list[str] = []
    real = backend.cls._export
    monkeypatch.setattr(
        backend.cls, "_export", lambda self, run, plan: calls.append("x") or real(self, run, plan)
    )
    [again] = export_run(out, backend.config)
    assert again.status is ExportStatus.SKIPPED and calls == []

    records[0]["reward"] = 1.0 - records[0]["reward"]
    write_rollouts(out, records)
    write_aggregate(out, records)
    [changed] = export_run(out, backend.config)  # detected and refused by the receipt, backend untouched
    assert changed.status is ExportStatus.FAILED and "changed" in (changed.reason or "") and calls == []
    RunArtifacts.from_path(out).export_done_fpath(backend.name).unlink()  # the user's "export it anyway"
    [fresh] = export_run(out, backend.config)
    assert fresh.status is ExportStatus.EXPORTED and calls == ["x"], fresh.reason
    assert fresh.backend_run_id != first.backend_run_id  # the changed run is a new backend run


def test_live_then_certify(backend: Backend, tmp_path: Path) -> None:
    """Live calls all arrive within the teardown deadline; a completed run is certified, not duplicated."""
    out, records = backend.run(tmp_path / "run")
    live = _live_session(backend, out, records, complete=True)
    [report] = live.reports
    assert report.setup_error is None and report.run_id, report.describe()
    assert report.lost == 0 and report.teardown_finished, report.describe()
    assert report.delivered >= 3, report.describe()  # config, metrics (maybe batched), rollouts

    [result] = export_run(out, backend.config, certify=True)
    assert result.status is ExportStatus.EXPORTED, result.reason
    if backend.cls._certify is LiveExporter._certify:  # the backend declines to certify (allowed)
        assert result.backend_run_id != report.run_id
    else:
        assert (result.backend_run_id, result.reason) == (report.run_id, CERTIFIED_NOTE)
    [again] = export_run(out, backend.config, certify=True)
    assert again.status is ExportStatus.SKIPPED


def test_resume_reopens_or_starts_over(backend: Backend, tmp_path: Path) -> None:
    """A resumed eval goes on logging, into the earlier backend run when the backend can reopen it."""
    out, records = backend.run(tmp_path / "run")
    first = _live_session(backend, out, records[:6], complete=False).reports[0]
    with backend.live(out, resume=True) as live:
        live.export_metrics({"reward": 1.0}, step=5)
        live.export_rollouts(records[6:])
    [second] = live.reports
    assert second.setup_error is None and second.lost == 0 and second.teardown_finished, second.describe()
    assert first.run_id and second.run_id
    # Reopened (the same run) or started over; either way the marker names the run it ended with.
    marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath(backend.name))
    assert marker is not None and marker.run_id == second.run_id
    assert len(out.with_name("eval_metrics.jsonl").read_text().splitlines()) == 6  # the journal goes on


def test_no_secret_is_stored(backend: Backend, tmp_path: Path) -> None:
    """Live and post-run, nothing the backend stored holds the config's secret."""
    out, records = backend.run(tmp_path / "run")
    _live_session(backend, out, records, complete=False)
    [result] = export_run(out, backend.config, certify=False)
    assert result.status is ExportStatus.EXPORTED, result.reason
    leaks = [
        str(p)
        for p in backend.store.rglob("*")
        if p.is_file() and not p.is_symlink() and SECRET_CANARY.encode() in p.read_bytes()
    ]
    leaks += [str(p) for p in out.parent.glob("eval_*.json") if SECRET_CANARY.encode() in p.read_bytes()]
    assert leaks == []


def test_listing_imports_no_sdk(backend: Backend) -> None:
    """``gym-artifacts exporters`` (and loading the class) never imports the backend's SDK."""
    sdk = backend.cls.sdk_module or "gym_artifacts_no_sdk"
    code = (
        "import sys; from gym_artifacts.cli import main; main(['exporters']); "
        f"from gym_artifacts.registry import get_entry; get_entry({backend.name!r}).load(); "
        f"sys.exit(3 if {sdk!r} in sys.modules else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"listing imported {sdk}: {proc.stderr[-2000:]}"
    assert backend.name in proc.stdout
