"""run_status: the API behind ``gym-artifacts status`` (the CLI only prints what it returns)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_artifacts import export_run
from gym_artifacts.cli import main
from gym_artifacts.core.errors import MissingRunError
from gym_artifacts.export.status import run_status


def test_status_before_and_after_an_export(quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omegaconf import OmegaConf

    before = run_status(quickstart_run)
    assert before.missing_for_export is None and before.exporters["local"]["receipt"] == "none"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}})
    [result] = export_run(quickstart_run, cfg)
    after = run_status(quickstart_run)
    assert after.run_identity == before.run_identity
    assert after.exporters["local"]["receipt"] == "matches"
    assert after.exporters["local"]["backend_run_id"] == result.backend_run_id
    assert main(["status", str(quickstart_run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == after.to_json()  # the CLI prints the API's answer


def test_missing_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MissingRunError):
        run_status(tmp_path / "nothing.jsonl")
