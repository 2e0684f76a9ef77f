"""Exporter discovery: entry points, unknown names, duplicate names naming both providers (and
costing only that name), a plugin that cannot load."""

from __future__ import annotations

import json
import os

import pytest

from gym_artifacts.contract import registry
from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import ExportPlan, Sent
from gym_artifacts.core.errors import ConfigError


def test_builtin_local_is_registered_by_entry_point() -> None:
    entry = registry.discover()["local"]
    assert entry.target == "gym_artifacts._builtin_exporters.local:LocalExporter"
    assert entry.provider == "gym-artifacts"
    assert entry.sdk_installed()


def test_duplicate_name_names_both() -> None:
    class OtherLocal(Exporter):
        name = "local"

        def _export(self, run: object, plan: ExportPlan) -> Sent:
            raise NotImplementedError

    with pytest.raises(
        ConfigError,
        match=r"'local' is registered twice: gym_artifacts\._builtin_exporters\.local:LocalExporter .*OtherLocal",
    ):
        registry.register(OtherLocal, provider="some-plugin")


def test_unknown_name_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"unknown exporter 'nope' \(known: .*local"):
        registry.get_entry("nope")


# -- the backend contract, checked when a class is loaded -----------------------------------------
from gym_artifacts.contract.hooks import CannotCertify  # noqa: E402
from gym_artifacts.contract.live_exporter import LiveExporter  # noqa: E402
from tests.backends import RecordingLive  # noqa: E402
from tests.conftest import copy_quickstart  # noqa: E402


class NoRolloutsLive(LiveExporter):
    """A live backend that forgot ``_log_metrics`` and ``_teardown``."""

    name = "norollouts"

    def _setup(self) -> str:
        return "r"

    def _log_config(self, config: dict) -> None: ...
    def _export(self, run: object, plan: ExportPlan) -> Sent:
        return Sent("r")


class NoExport(Exporter):
    name = "noexport"


def test_missing_live_hook_fails_at_load_naming_the_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    # As an installed plugin would be: an entry point naming the class.
    entry = registry.ExporterEntry("norollouts", f"{__name__}:NoRolloutsLive", "some-plugin")
    monkeypatch.setattr(registry, "discover", lambda: {"norollouts": entry})
    with pytest.raises(ConfigError, match=r"does not implement the required hook\(s\) _log_metrics, _teardown"):
        registry.get_entry("norollouts").load()


def test_missing_post_run_hook_fails_at_register() -> None:
    with pytest.raises(ConfigError, match=r"NoExport does not implement the required hook\(s\) _export"):
        registry.register(NoExport)
    assert "noexport" not in registry.discover()


def test_name_must_match_the_registered_name() -> None:
    entry = registry.ExporterEntry("other", "tests.backends:RecordingLive", "some-plugin")
    with pytest.raises(ConfigError, match=r"has name = 'recording'; it must equal its registered name 'other'"):
        entry.load()


def test_default_certify_says_cannot_certify_not_a_bug() -> None:
    exporter = RecordingLive(RecordingLive.config_model())
    with pytest.raises(CannotCertify):
        exporter._certify(None, None, "x")  # type: ignore[arg-type]
    assert not issubclass(CannotCertify, NotImplementedError)


# -- a broken or clashing third-party registration costs only its own name -----------------------
from importlib.metadata import EntryPoint  # noqa: E402
from pathlib import Path  # noqa: E402

from gym_artifacts import export_runs, list_exporters  # noqa: E402
from tests.processes import run_bounded  # noqa: E402


def _with_entry_points(monkeypatch: pytest.MonkeyPatch, *extra: EntryPoint) -> None:
    """The installed entry points plus ``extra`` (as if another distribution declared them)."""
    real = registry.entry_points

    def patched(group: str) -> list[EntryPoint]:
        return [*real(group=group), *(ep for ep in extra if ep.group == group)]

    monkeypatch.setattr(registry, "entry_points", patched)
    # The scan is cached per process: forget it here, and get the real one back when the test ends.
    monkeypatch.setattr(registry, "_installed", None)


CLASH = EntryPoint("mlflow", "tests.backends:RecordingLive", registry.GROUP)
BROKEN = EntryPoint("broken", "no_such_module_anywhere:Exporter", registry.GROUP)
RAISING = EntryPoint("raising", "tests.plugin_raises_on_import:Exporter", registry.GROUP)


@pytest.mark.slow
def test_a_name_registered_twice_is_refused_for_that_name_only(
    monkeypatch: pytest.MonkeyPatch, quickstart_run: Path, local_config: Path
) -> None:
    _with_entry_points(monkeypatch, CLASH)
    rows = {r["name"]: r for r in list_exporters()}
    assert "registered twice" in rows["mlflow"]["modes"] and "tests.backends:RecordingLive" in rows["mlflow"]["modes"]
    assert rows["local"]["modes"] == "live, post-run"
    [out] = export_runs([quickstart_run], config=local_config, exporters=["local"])
    assert [r.status.value for r in out.results] == ["EXPORTED"]
    with pytest.raises(ConfigError, match=r"'mlflow' is registered twice"):  # never picks one of the two
        export_runs([quickstart_run], config=local_config, exporters=["mlflow"])
    with pytest.raises(ConfigError, match=r"'mlflow' is registered twice"):
        registry.get_entry("mlflow")


def test_a_plugin_that_cannot_load_is_listed_as_such_and_the_rest_export(
    monkeypatch: pytest.MonkeyPatch, quickstart_run: Path, local_config: Path
) -> None:
    _with_entry_points(monkeypatch, BROKEN, RAISING)
    rows = {r["name"]: r for r in list_exporters()}
    assert rows["broken"]["modes"].startswith("cannot load") and rows["broken"]["sdk_installed"] is False
    assert "fails at import" in rows["raising"]["modes"] and rows["raising"]["modes"].startswith("cannot load")
    [chosen] = export_runs([quickstart_run], config=local_config, exporters=["raising"])
    assert not chosen.results and "exporter 'raising': cannot load" in str(chosen.config_error)
    assert rows["local"]["sdk_installed"] is True
    [out] = export_runs([quickstart_run], config=local_config, exporters=["local"])
    assert [r.status.value for r in out.results] == ["EXPORTED"]


def test_the_cli_lists_every_backend_beside_a_clash(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gym_artifacts.cli import main

    _with_entry_points(monkeypatch, CLASH, BROKEN)
    assert main(["exporters"]) == 0
    out = capsys.readouterr().out
    for name in ("local", "wandb", "tensorboard", "mlflow", "broken"):
        assert f"\n{name} " in out, (name, out)
    assert "registered twice" in out and "cannot load" in out


MISBEHAVING_IMPORTS = {
    "exit-3": "import sys\nsys.exit(3)\n",
    "exit-0": "import sys\nsys.exit(0)\n",
    "exit-text": "raise SystemExit('plugin says goodbye')\n",
    "keyboard-interrupt": "raise KeyboardInterrupt\n",
    "sleeps": "import time\ntime.sleep(10**6)\n",
    "waits": "import threading\nthreading.Event().wait()\n",
    "spins": "while True:\n    pass\n",
}


def _misbehaving_distribution(root: Path, bodies: dict[str, str]) -> Path:
    """A folder holding an installed distribution (a ``.dist-info`` with its entry points) whose
    backends' modules each misbehave while they are imported, as ``pip install`` would leave it."""
    info = root / "misbehaving_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: misbehaving-plugins\nVersion: 0.1\n")
    lines = ["[gym_artifacts.exporters]"]
    for name, body in bodies.items():
        module = "misbehaving_" + name.replace("-", "_")
        (root / f"{module}.py").write_text(body)
        lines.append(f"{name} = {module}:Exporter")
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_a_plugin_that_exits_or_blocks_at_import_is_listed_as_cannot_load(tmp_path: Path) -> None:
    """``sys.exit()`` at import, ``SystemExit``, ``KeyboardInterrupt``, a sleep, a wait and a
    busy loop that never end: ``gym-artifacts exporters`` still lists every backend, each of
    these as ``cannot load`` with its reason, within its load time limit; choosing one to export
    is an error naming it, in bounded time too."""
    import sys

    site = _misbehaving_distribution(tmp_path / "site", MISBEHAVING_IMPORTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "GYM_ARTIFACTS_PLUGIN_LOAD_SECONDS": "2"}  # fmt: skip
    listing = run_bounded(
        [sys.executable, "-m", "gym_artifacts", "exporters", "--json"],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    for name in MISBEHAVING_IMPORTS:
        assert rows[name]["modes"].startswith("cannot load"), rows[name]
        assert rows[name]["sdk_installed"] is False
    assert "within 2 s" in rows["sleeps"]["modes"] and "within 2 s" in rows["spins"]["modes"]
    assert "SystemExit" in rows["exit-3"]["modes"] and "3" in rows["exit-3"]["modes"]
    assert rows["local"]["modes"] == "live, post-run"
    run = copy_quickstart(tmp_path / "runs")
    for name in ("exit-3", "sleeps"):
        export = run_bounded(
            [sys.executable, "-m", "gym_artifacts", "export", str(run), "-e", name],
            env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert export.returncode != 0 and f"exporter '{name}': cannot load" in export.stdout + export.stderr, (
            export.stdout[-2000:], export.stderr[-2000:])  # fmt: skip
