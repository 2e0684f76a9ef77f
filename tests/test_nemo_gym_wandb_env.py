"""W&B under the drop-in: the SDK decides the mode from the environment, as under NeMo Gym.

NeMo Gym's own W&B exporter calls ``wandb.init(project=, name=, dir=)`` and nothing more, so
``WANDB_MODE=offline`` (how clusters without internet log, then ``wandb sync``), ``disabled`` and
the other ``WANDB_*`` variables decide. The drop-in must do the same: no mode of its own.
Real W&B offline runs, read back from their files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts import nemo_gym
from gym_artifacts._builtin_exporters.wandb import WandbExporter, WandbSettings
from tests.processes import run_bounded
from tests.wandb_records import offline_runs


def ng_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """NeMo Gym's flat W&B keys only (no ``exporters.wandb`` section of this project)."""
    return {
        "output_jsonl_fpath": str(tmp_path / "results" / "rollouts.jsonl"),
        "results_dir": str(tmp_path / "results"),
        "wandb_project": "ng",
        "wandb_name": "ng-run",
        "wandb_api_key": "w" * 40,
        **extra,
    }


def wandb_section(config: dict[str, Any]) -> WandbSettings:
    return WandbSettings.model_validate(nemo_gym.drop_in_config(config)["exporters"]["wandb"])


@pytest.mark.parametrize(
    ("environ", "mode"),
    [({}, "online"), ({"WANDB_MODE": "offline"}, "offline"), ({"WANDB_MODE": "dryrun"}, "offline"),
     ({"WANDB_MODE": "disabled"}, "disabled"), ({"WANDB_MODE": "online"}, "online"),
     ({"WANDB_MODE": "run"}, "online")],
)  # fmt: skip
def test_the_drop_in_takes_the_mode_the_sdk_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], mode: str
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    settings = wandb_section(ng_config(tmp_path))
    assert WandbExporter.destination_for(settings)["mode"] == mode
    assert WandbExporter(settings).mode == mode


def test_an_explicit_mode_of_this_project_still_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    settings = wandb_section(ng_config(tmp_path, exporters={"wandb": {"mode": "offline"}}))
    assert WandbExporter(settings).mode == "offline"


def test_wandb_mode_offline_logs_offline_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster case: no internet, WANDB_MODE=offline; setup must not wait for a server."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: online would hang
    config = ng_config(tmp_path, exporters={"wandb": {"init_timeout": 20}})
    started = time.monotonic()
    opened = nemo_gym.setup_exporters(config)
    try:
        assert [e.name for e in opened] == ["wandb"]
        nemo_gym.export_metrics({"progress/done": 1.0}, step=1)
    finally:
        nemo_gym.teardown_exporters()
    assert time.monotonic() - started < 15  # far less than the 20 s an online init would wait
    [run] = offline_runs(tmp_path / "results" / "wandb")
    assert [row["progress/done"] for row in run.history if "progress/done" in row] == [1.0]


def test_wandb_mode_disabled_opens_nothing_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    opened = nemo_gym.setup_exporters(ng_config(tmp_path))
    try:
        nemo_gym.export_metrics({"progress/done": 1.0}, step=1)
    finally:
        nemo_gym.teardown_exporters()
    assert [e.name for e in opened] == ["wandb"]
    assert not list((tmp_path / "results").rglob("*.wandb"))


@pytest.mark.slow
def test_every_wandb_variable_reaches_the_run_as_under_nemo_gym(tmp_path: Path) -> None:
    """NeMo Gym's exporter leaves everything but project, name and folder to the SDK: the
    ``WANDB_*`` variables for tags, group, notes and job type reach the run here too. In a fresh
    interpreter, as an eval is (the SDK reads its variables once per process)."""
    import json
    import sys

    script = (
        "from gym_artifacts import nemo_gym\n"
        f"nemo_gym.setup_exporters({ng_config(tmp_path)!r})\n"
        "nemo_gym.teardown_exporters()\n"
    )
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_TAGS": "nightly,ng", "WANDB_RUN_GROUP": "sweep-7",
           "WANDB_NOTES": "from env", "WANDB_JOB_TYPE": "eval"}  # fmt: skip
    run_bounded([sys.executable, "-c", script], env=env, check=True, timeout=120, capture_output=True)
    [folder] = sorted((tmp_path / "results" / "wandb").rglob("offline-run-*"))
    [record] = folder.glob("run-*.wandb")
    wandb_bin = Path(sys.executable).with_name("wandb")
    out = run_bounded([str(wandb_bin), "leet", "inspect", "--json", str(record)],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    run: dict[str, Any] = {}  # the run record (the SDK may write it more than once)
    for line in out.splitlines():
        entry = json.loads(line)
        if entry.get("type") == "run":
            run.update(entry["run"])
    assert run.get("tags") == ["nightly", "ng"]
    assert run.get("run_group") == "sweep-7" and run.get("notes") == "from env" and run.get("job_type") == "eval"
