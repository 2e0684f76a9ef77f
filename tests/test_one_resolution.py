"""One resolution per export: a real ``gym-artifacts export`` of one run to two backends (local and
MLflow on SQLite) reads the run's config once, validates each backend's settings once and scans
the entry points once, whatever module asks.

The counters wrap the real functions wherever a module holds them (a module-level
``from x import f`` binds its own name), so a new caller anywhere in the package is counted too.
The export itself is checked where it lands: the local store and the MLflow database.
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from gym_artifacts.cli import main
from gym_artifacts.contract import registry
from gym_artifacts.core import config as config_module
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts
from tests.mlflow_store import mlflow_sqlite

# Every module an export goes through that could bind the counted functions under its own name.
EXPORT_MODULES = (
    "gym_artifacts._builtin_exporters.local",
    "gym_artifacts._builtin_exporters.mlflow",
    "gym_artifacts.export.executors",
    "gym_artifacts.export.engine",
    "gym_artifacts.run.run_config",
    "gym_artifacts.report.build",
    "gym_artifacts.run.names",
    "gym_artifacts.export.status",
)


def spy_everywhere(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, record: Callable[..., None]
) -> None:
    """Wrap ``owner.name`` and every module's binding of the same function: each call is recorded
    (``record(*args, **kwargs)``) and then runs the real function."""
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        record(*args, **kwargs)
        return real(*args, **kwargs)

    for module in list(sys.modules.values()):
        module_name = getattr(module, "__name__", "") or ""
        if not module_name.startswith(("gym_artifacts", "exporters")):
            continue
        if getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, spy)
    monkeypatch.setattr(owner, name, spy)


def test_one_export_of_one_run_resolves_config_settings_and_entry_points_once(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    uri = mlflow_sqlite(tmp_path / 'm.db')
    cfg = tmp_path / "two.yaml"
    cfg.write_text(
        "exporters:\n"
        f"  local: {{enabled: true, root: {tmp_path / 'store'}, experiment: tests}}\n"
        f"  mlflow: {{enabled: true, tracking_uri: '{uri}', experiment_name: once}}\n"
        "  wandb: {enabled: false}\n"
    )
    assert run.config_fpath.is_file()  # the quickstart run has a saved config to read
    for module in EXPORT_MODULES:  # loaded first, so that their own bindings are wrapped too
        importlib.import_module(module)

    registry.reset_cache()  # a fresh process: nothing scanned yet
    config_reads: Counter[str] = Counter()
    validations: Counter[str] = Counter()
    scans: Counter[str] = Counter()

    def on_read(fpath: Any, *args: Any, **kwargs: Any) -> None:
        config_reads[Path(fpath).name] += 1

    spy_everywhere(monkeypatch, config_module, "load_yaml_config", on_read)
    spy_everywhere(
        monkeypatch, config_module, "validate_settings", lambda model, section, name: validations.update([name])
    )
    spy_everywhere(monkeypatch, registry, "entry_points", lambda group=None: scans.update([group]))

    assert main(["export", str(quickstart_run), "-c", str(cfg), "-q"]) == 0

    assert config_reads[run.config_fpath.name] == 1, config_reads
    assert config_reads[cfg.name] == 1, config_reads  # the -c file, read once too
    assert config_reads["default.yaml"] <= 1, config_reads  # the embedded default's layer
    assert validations == Counter({"local": 1, "mlflow": 1}), validations
    assert scans == Counter({registry.GROUP: 1}), scans
    # The export happened: a receipt per backend, the run in the local store and in MLflow.
    for name in ("local", "mlflow"):
        [receipt] = read_receipts(run.export_done_fpath(name))
        assert receipt.backend_run_id
    assert list((tmp_path / "store").rglob("*.jsonl"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("once")
    assert experiment is not None and len(client.search_runs([experiment.experiment_id])) == 1


def test_the_entry_point_cache_is_reset_for_plugins_installed_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan is kept for the process; ``reset_cache`` makes the next one look again."""
    from importlib.metadata import EntryPoint

    registry.reset_cache()
    before = registry.discover()
    late = EntryPoint("late", "tests.backends:RecordingLive", registry.GROUP)
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda group: [*real(group=group), late])
    assert "late" not in registry.discover()  # cached: the process scanned once
    registry.reset_cache()
    assert "late" in registry.discover() and set(before) < set(registry.discover())
    monkeypatch.undo()
    registry.reset_cache()
    assert "late" not in registry.discover()


def test_the_config_an_export_read_is_shared_as_copies_and_only_for_its_run(make_run: Callable[..., Path]) -> None:
    """While an export sends, a backend asking for the run's config gets a copy of what the
    export read (changing it changes nothing for the next backend); another run's config is
    still read from its own file, and after the export the file is read again."""
    from gym_artifacts.run.run_config import load_run_config, run_config_of_export

    run, other = RunArtifacts.from_path(make_run()), RunArtifacts.from_path(make_run("other"))
    read = load_run_config(run)
    with run_config_of_export(run, read):
        run.config_fpath.write_text("changed_on_disk: true\n")  # not read again during the export
        first = load_run_config(run)
        first["tampered"] = True
        second = load_run_config(run)
        assert second == read and "tampered" not in second and first is not second
        other.config_fpath.write_text("other_run: 1\n")
        assert dict(load_run_config(other)) == {"other_run": 1}
    assert dict(load_run_config(run)) == {"changed_on_disk": True}
