"""The backend contract suite (Lightning's ``test_all`` idea): the same tests for every backend.

Parametrized over every registered exporter (built-in or installed; ``GYM_ARTIFACTS_CONTRACT``
= ``name,name`` narrows it) whose SDK is installed. Each backend runs with the settings its
``contract_settings(folder)`` returns, so all it stores lands in one folder per backend, which
the secrets check then reads byte by byte. A backend that needs a running service (a server, an
endpoint) gets its settings from a pytest fixture named ``contract_service_<name>`` returning a
:class:`ContractService` instead (see docs/plugins.md). Post-run-only backends skip the live
tests, saying so. Run it with ``python -m gym_artifacts.testing NAME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from gym_artifacts import export_run
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import ExportStatus, hooks_with_wrong_signatures, missing_hooks
from gym_artifacts.contract.live_exporter import LiveExporter
from gym_artifacts.core.destination import destination_key
from gym_artifacts.core.jsonio import canonical_json
from gym_artifacts.core.secrets import is_secret_key
from gym_artifacts.live.fanout import LiveRun, live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_marker, read_receipts
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
SERVICE_FIXTURE = "contract_service_{}"  # the fixture giving a service-backed backend's settings
CREDENTIAL_CANARY = "cred-" + "9f8e7d6c5b4a3f2e"  # put in every credential a destination must drop


@dataclass(frozen=True)
class ContractService:
    """What a pytest fixture ``contract_service_<name>`` returns for a backend that needs a service.

    ``settings(folder)``: settings aimed at the running service for one test folder; two
    folders must give two destinations (name the dataset/project/experiment after the folder).
    ``stored()``: every byte the service holds or was sent so far (files, request bodies), read
    by the secrets check; None when the service keeps nothing the suite can read.
    """

    settings: Callable[[Path], dict[str, Any]]
    stored: Callable[[], Iterable[bytes]] | None = None


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

    def __init__(self, name: str, store: Path, request: pytest.FixtureRequest) -> None:
        entry = registry.get_entry(name)
        if not entry.sdk_installed():
            pytest.skip(f"{name}: its SDK ({entry.load().sdk_module}) is not installed")
        self.name = name
        self.cls = entry.load()
        self.store = store
        self.service = _service(request, name)
        if self.service is None and self.cls.contract_settings(store) is None:
            fixture = SERVICE_FIXTURE.format(_fixture_name(name))
            pytest.skip(f"{name}: needs a service; its contract_settings() returned None and no fixture "
                        f"{fixture} provides one (docs/plugins.md)")  # fmt: skip
        self.settings: dict[str, Any] = self.settings_for(store)

    def settings_for(self, folder: Path) -> dict[str, Any]:
        """The settings that keep everything in ``folder`` (or aim at the service for it)."""
        if self.service is not None:
            return dict(self.service.settings(folder))
        return dict(self.cls.contract_settings(folder) or {})

    @property
    def is_live(self) -> bool:
        return issubclass(self.cls, LiveExporter)

    def require_live(self) -> None:
        if not self.is_live:
            pytest.skip(f"{self.name} is post-run only (no live hooks): no live logging, resume or certify")

    def config_with(self, settings: dict[str, Any]) -> Any:
        from omegaconf import OmegaConf

        return OmegaConf.create({"exporters": {self.name: {"enabled": True, **settings}}})

    @property
    def config(self) -> Any:
        return self.config_with(self.settings)

    def destination(self, settings: dict[str, Any]) -> dict[str, Any]:
        return self.cls.destination_for(self.cls.config_model.model_validate({"enabled": True, **settings}))

    def stored_bytes(self) -> Iterator[tuple[str, bytes]]:
        """Everything the backend stored: the files under its folder, and what its service holds."""
        for p in self.store.rglob("*"):
            if p.is_file() and not p.is_symlink():
                yield str(p), p.read_bytes()
        if self.service is not None and self.service.stored is not None:
            for i, blob in enumerate(self.service.stored()):
                yield f"{self.name} service item {i}", blob

    def run(self, folder: Path) -> tuple[Path, list[dict[str, Any]]]:
        return make_run(folder, self.name, self.settings)

    def live(self, out: Path, *, resume: bool = False) -> Any:
        cfg = run_config(self.name, self.settings) | ({"resume": True} if resume else {})
        return live_run(cfg, out, teardown_timeout=TEARDOWN_DEADLINE_S)


def _fixture_name(name: str) -> str:
    return name.replace("-", "_")


def _service(request: pytest.FixtureRequest, name: str) -> ContractService | None:
    """The ``contract_service_<name>`` fixture's value, when one is defined (it may skip)."""
    try:
        return request.getfixturevalue(SERVICE_FIXTURE.format(_fixture_name(name)))
    except pytest.FixtureLookupError:
        return None


def respelled(settings: dict[str, Any]) -> dict[str, Any]:
    """The same places written another way: absolute paths made relative to the working folder
    with a trailing slash, ``sqlite:////abs`` as ``sqlite:///rel``, URLs with an upper-case
    scheme and a trailing slash. A backend must see one destination in both."""
    out = dict(settings)
    for key, value in settings.items():
        if not isinstance(value, str):
            continue
        if value.startswith("sqlite:////"):
            out[key] = "sqlite:///" + os.path.relpath(value[len("sqlite:///") :])
        elif value.startswith(("http://", "https://")):
            scheme, rest = value.split("://", 1)
            out[key] = f"{scheme.upper()}://{rest.rstrip('/')}/"
        elif os.path.isabs(value):
            out[key] = os.path.join(".", os.path.relpath(value), "")
    return out


def with_credentials(model: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with a credential in every secret setting and in every URI's user, password
    and ``token`` query parameter."""
    out = dict(settings)
    for key, field in model.model_fields.items():
        if is_secret_key(key) or "SecretStr" in str(field.annotation):
            out[key] = CREDENTIAL_CANARY
        elif key.endswith(("url", "uri")) and key not in settings and "str" in str(field.annotation):
            out[key] = "https://backend.invalid/api"  # a server setting the contract settings leave out
    for key, value in list(out.items()):
        if isinstance(value, str) and "://" in value:
            parts = urlsplit(value)
            query = "&".join(filter(None, [f"token={CREDENTIAL_CANARY}", parts.query]))
            netloc = f"user:{CREDENTIAL_CANARY}@{parts.netloc}"
            out[key] = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return out


@pytest.fixture(scope="module", params=contract_exporters())
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def store(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where one backend keeps everything, across its tests (one database per backend, not per test)."""
    yield tmp_path_factory.mktemp(f"store-{backend_name}")


@pytest.fixture
def backend(backend_name: str, store: Path, request: pytest.FixtureRequest) -> Backend:
    return Backend(backend_name, store, request)


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
    assert missing_hooks(backend.cls) == [], "required hooks left out"
    assert hooks_with_wrong_signatures(backend.cls) == [], "hooks the core cannot call as the contract does"
    assert backend.cls.name == backend.name
    backend.cls.config_model.model_validate({"enabled": True, **backend.settings})
    with pytest.raises(Exception, match=r"(?i)extra|not permitted"):
        backend.cls.config_model.model_validate({"enabled": True, "surely_not_a_setting": 1})


def test_export_skip_and_change(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exported once (the run's content lands where the backend stores); a retry after a crash
    before the receipt finds the same backend run; the same content again SKIPPED without
    contacting the backend; a change detected."""
    out, records = backend.run(tmp_path / "run")
    [first] = export_run(out, backend.config)
    assert first.status is ExportStatus.EXPORTED, first.reason
    assert first.backend_run_id and first.rows == ROLLOUTS
    nonce = records[0]["response"]["nonce"].encode()  # this run's mark, in no earlier run
    assert any(nonce in data for _, data in backend.stored_bytes()), "the export stored nothing of the run"

    # A crash after the backend run was written, before the receipt: the retry finds that run.
    RunArtifacts.from_path(out).export_done_fpath(backend.name).unlink()
    [retried] = export_run(out, backend.config)
    assert retried.status is ExportStatus.EXPORTED, retried.reason
    assert retried.backend_run_id == first.backend_run_id, "a retried export made a second backend run"

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
    backend.require_live()
    out, records = backend.run(tmp_path / "run")
    live = _live_session(backend, out, records, complete=True)
    [report] = live.reports
    assert report.setup_error is None and report.run_id, report.describe()
    assert report.lost == 0 and report.teardown_finished, report.describe()
    assert report.delivered >= 3, report.describe()  # config, metrics (maybe batched), rollouts

    [result] = export_run(out, backend.config, certify=True)
    assert result.status is ExportStatus.EXPORTED, result.reason
    if backend.cls._certify is LiveExporter._certify:  # the backend declines to certify (allowed)
        assert result.backend_run_id != report.run_id and not result.certified
    else:
        assert (result.backend_run_id, result.certified) == (report.run_id, True)
    [again] = export_run(out, backend.config, certify=True)
    assert again.status is ExportStatus.SKIPPED


def test_resume_reopens_or_starts_over(backend: Backend, tmp_path: Path) -> None:
    """A resumed eval goes on logging, into the earlier backend run when the backend can reopen it."""
    backend.require_live()
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
    """Live (for a live backend) and post-run, nothing the backend stored holds the config's secret."""
    out, records = backend.run(tmp_path / "run")
    if backend.is_live:
        _live_session(backend, out, records, complete=False)
    [result] = export_run(out, backend.config, certify=False)
    assert result.status is ExportStatus.EXPORTED, result.reason
    stored = list(backend.stored_bytes())
    nonce = records[0]["response"]["nonce"].encode()  # proof that the scan reads where the run landed
    assert any(nonce in data for _, data in stored), "nothing of the run found where the backend stores"
    leaks = [where for where, data in stored if SECRET_CANARY.encode() in data]
    leaks += [str(p) for p in out.parent.glob("eval_*.json") if SECRET_CANARY.encode() in p.read_bytes()]
    assert leaks == []


def test_one_receipt_per_destination(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another destination gets the run once more, with a receipt of its own; the same destination
    spelled differently (relative path, trailing slash, equivalent URL) skips without calling the
    backend; no credential of the settings reaches a destination or a receipt."""
    out, _ = backend.run(tmp_path / "run")
    elsewhere = backend.settings_for(backend.store / "elsewhere")
    here_dest, elsewhere_dest = backend.destination(backend.settings), backend.destination(elsewhere)
    assert here_dest != elsewhere_dest, "contract settings of two folders must be two destinations"
    for settings in (backend.settings, elsewhere):
        [result] = export_run(out, backend.config_with(settings))
        assert result.status is ExportStatus.EXPORTED, result.reason
    receipts = read_receipts(RunArtifacts.from_path(out).export_done_fpath(backend.name))
    assert sorted(r.destination_key for r in receipts) == sorted(
        destination_key(d) for d in (here_dest, elsewhere_dest)
    )

    calls: list[str] = []
    real = backend.cls._export
    monkeypatch.setattr(
        backend.cls, "_export", lambda self, run, plan: calls.append("x") or real(self, run, plan)
    )
    for settings in (respelled(backend.settings), respelled(elsewhere)):
        assert backend.destination(settings) in (here_dest, elsewhere_dest), settings
        [again] = export_run(out, backend.config_with(settings))
        assert again.status is ExportStatus.SKIPPED and calls == [], (settings, again.reason)
    assert len(read_receipts(RunArtifacts.from_path(out).export_done_fpath(backend.name))) == 2

    credentialed = with_credentials(backend.cls.config_model, backend.settings)
    assert CREDENTIAL_CANARY.encode() not in canonical_json(backend.destination(credentialed))


def test_listing_imports_no_sdk(backend: Backend) -> None:
    """``gym-artifacts exporters`` (and loading the class) never imports the backend's SDK."""
    sdk = backend.cls.sdk_module or "gym_artifacts_no_sdk"
    code = (
        "import sys; from gym_artifacts.cli import main; main(['exporters']); "
        f"from gym_artifacts.contract.registry import get_entry; get_entry({backend.name!r}).load(); "
        f"sys.exit(3 if {sdk!r} in sys.modules else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"listing imported {sdk}: {proc.stderr[-2000:]}"
    assert backend.name in proc.stdout
