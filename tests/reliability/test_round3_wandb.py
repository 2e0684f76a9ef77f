"""Issue 27 (14): W&B offline, an export retried after its receipt was lost leaves one offline run
folder for the run id, holding the complete run (``wandb sync`` then uploads one run once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts.export import export_run
from gym_artifacts.run import RunArtifacts
from tests.wandb_records import offline_runs


@pytest.mark.slow
def test_a_retry_after_a_lost_receipt_leaves_one_offline_folder(quickstart_run: Path, tmp_path: Path) -> None:
    cfg = OmegaConf.create(
        {"exporters": {"wandb": {"enabled": True, "mode": "offline", "dir": str(tmp_path / "wb")}}}
    )
    [first] = export_run(quickstart_run, cfg)
    assert first.status.value == "EXPORTED"
    RunArtifacts.from_path(quickstart_run).export_done_fpath("wandb").unlink()  # the receipt is lost
    [again] = export_run(quickstart_run, cfg)
    assert again.status.value == "EXPORTED" and again.backend_run_id == first.backend_run_id
    folders = sorted((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{first.backend_run_id}"))
    assert len(folders) == 1, folders
    [run] = offline_runs(tmp_path / "wb")
    assert run.run_id == first.backend_run_id and run.exit_code == 0
    assert run.summary["gym_artifacts/identity"]
