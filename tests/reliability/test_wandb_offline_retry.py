"""W&B offline, an export retried after its receipt was lost leaves one offline run
folder for the run id, holding the complete run (``wandb sync`` then uploads one run once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.wandb import offline_folders
from gym_artifacts.run.artifacts import RunArtifacts
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
    # W&B names a second folder of the same id in the same second ``...-<id>-1``: both count
    folders = offline_folders(tmp_path / "wb" / "wandb", first.backend_run_id)
    assert len(folders) == 1, folders
    [run] = offline_runs(tmp_path / "wb")
    assert run.run_id == first.backend_run_id and run.exit_code == 0
    assert run.summary["gym_artifacts/identity"]


def test_folders_of_one_id_started_in_the_same_second_are_one_run(tmp_path: Path) -> None:
    """W&B names the second folder of an id started within the same second ``...-<id>-1``: the
    retry's folder is kept, every earlier one of that id (either form) removed, others untouched."""
    from gym_artifacts._builtin_exporters.wandb import _remove_earlier_offline_folders

    names = ["offline-run-20261202_082629-gaabc", "offline-run-20261202_082629-gaabc-1",
             "offline-run-20261202_082630-gaabc-2", "offline-run-20261202_082629-gaabcd",
             "run-20261202_082629-gaabc"]  # fmt: skip
    folder = tmp_path / "wandb"
    for name in names:
        (folder / name).mkdir(parents=True)
    _remove_earlier_offline_folders(folder / names[2], "gaabc")
    assert sorted(p.name for p in folder.iterdir()) == sorted(names[2:])
