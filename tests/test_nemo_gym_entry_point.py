"""The entry-point route: gym-artifacts registered under the group NeMo Gym proposes for exporter
plugins (``nemo_gym.exporters``, NVIDIA-NeMo/Gym issue #2989: "each plugin would provide an
exporter class and configuration model"), driven here as NeMo Gym's registry drives its built-in
exporters (``nemo_gym/exporters/__init__.py`` 0.7.0: ``config_model.model_validate(global
config).is_available``, then ``cls(global_config).setup()``, ``export_config()``, the
``export_*`` calls, ``teardown()``).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.journal import iter_journal

REPO = Path(__file__).resolve().parent.parent
GROUP = "nemo_gym.exporters"


def registered() -> list[EntryPoint]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    group = project["entry-points"][GROUP]
    return [EntryPoint(name, value, GROUP) for name, value in group.items()]


def nemo_gym_opens(global_config: dict[str, Any]) -> list[Any]:
    """NeMo Gym's setup loop over entry-point exporters."""
    opened = []
    for entry in registered():
        cls = entry.load()
        if not cls.config_model.model_validate(global_config).is_available:
            continue
        exporter = cls(global_config)
        exporter.setup()
        exporter.export_config()
        opened.append(exporter)
    return opened


def test_gym_artifacts_is_registered_under_nemo_gyms_group() -> None:
    [entry] = registered()
    cls = entry.load()
    assert entry.name == cls.name == "gym_artifacts"
    for method in ("setup", "teardown", "export_config", "export_metrics", "export_rollouts"):
        assert callable(getattr(cls, method))


def test_nemo_gyms_own_flat_keys_do_not_open_it(tmp_path: Path) -> None:
    """Its own W&B / MLflow exporters take those keys: gym-artifacts opens only for its section."""
    config = {"output_jsonl_fpath": str(tmp_path / "out.jsonl"), "mlflow_tracking_uri": "x",
              "mlflow_experiment_name": "e", "mlflow_run_name": "r"}  # fmt: skip
    assert nemo_gym_opens(config) == []


def test_driven_by_nemo_gyms_loop_it_logs_a_whole_run(tmp_path: Path) -> None:
    out = tmp_path / "results" / "rollouts.jsonl"
    out.parent.mkdir()
    config = {
        "output_jsonl_fpath": str(out),
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'ng.db'}",  # NeMo Gym's own MLflow keys
        "mlflow_experiment_name": "ng", "mlflow_run_name": "r",
        "gym_artifacts": {"exporters": {"local": {"root": str(tmp_path / "runs")}}},
    }  # fmt: skip
    [exporter] = nemo_gym_opens(config)
    try:
        exporter.export_metrics({"progress/done": 1.0}, 1)
        exporter.export_metrics({"progress/done": 2.0}, 2)
        exporter.export_rollouts([{"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0}])
    finally:
        exporter.teardown()
        exporter.teardown()  # NeMo Gym's teardown is safe to repeat
    assert [e.step for e in iter_journal(RunArtifacts.from_path(out))] == [1, 2]
    local_runs = [p for p in (tmp_path / "runs").rglob("*") if p.is_dir()]
    assert local_runs
    # only the section's backend: the MLflow keys are NeMo Gym's own exporter's, not opened here
    assert not (tmp_path / "ng.db").exists()
    metrics = [json.loads(line) for p in (tmp_path / "runs").rglob("*.jsonl") for line in p.read_text().splitlines()
               if "progress/done" in line]  # fmt: skip
    assert metrics


def test_a_section_that_opens_nothing_is_a_failed_setup(tmp_path: Path) -> None:
    """NeMo Gym skips an exporter whose setup raised (with a warning) and keeps the others."""
    config = {"output_jsonl_fpath": str(tmp_path / "o.jsonl"),
              "gym_artifacts": {"exporters": {"local": {"enabled": False}}}}  # fmt: skip
    [entry] = registered()
    cls = entry.load()
    assert cls.config_model.model_validate(config).is_available
    exporter = cls(config)
    try:
        exporter.setup()
    except Exception as exc:
        assert "no backend" in str(exc)
    else:
        raise AssertionError("setup opened nothing but did not say so")
    finally:
        exporter.teardown()
