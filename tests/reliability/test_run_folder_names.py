"""Issue 42 item 1: a local run folder's name keeps the run's identity whatever the run's name.

A sweep's folder names run past 100 characters (``llama-3.1-70b-instruct_gsm8k-cot-8shot_..._seed1``);
the run's name used to pass through the name shortener twice, the second time cutting off the
identity suffix, so two seeds shared one folder: the second export deleted the first's, and a
second live run got FileExistsError. One folder per identity (post-run) or per live run, for
names of any length and byte content.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run

SWEEP = "llama-3.1-70b-instruct_gsm8k-cot-8shot_temperature-0.7_top-p-0.95_max-tokens-4096_num-repeats-8"


def write_run(folder: Path, reward: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "rollouts.jsonl"
    out.write_text(json.dumps({"agent_ref": {"name": "a"}, "reward": reward}) + "\n")
    (folder / "rollouts_aggregate_metrics.json").write_text(
        json.dumps([{"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": reward}}])
    )
    return out


def local_cfg(root: Path) -> object:
    return OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(root), "experiment": "x"}}})


def assert_each_run_in_its_own_folder(root: Path, outs: list[Path]) -> None:
    folders = sorted((root / "x").iterdir())
    assert len(folders) == len(outs), [f.name for f in folders]
    for out in outs:
        [result] = export_run(out, local_cfg(root), verify=True)
        assert result.status is ExportStatus.SKIPPED, result.reason
        run_json = json.loads((root / "x" / str(result.backend_run_id) / "run.json").read_text())
        receipt = json.loads(out.with_name("rollouts_local_export_done.json").read_bytes())
        assert run_json["run_identity"] == receipt["receipts"][0]["run_identity"]
    for folder in folders:
        assert len(os.fsencode(folder.name)) <= 255


def test_two_seeds_of_a_long_sweep_name_get_two_folders(tmp_path: Path) -> None:
    outs = [write_run(tmp_path / "runs" / f"{SWEEP}_seed{seed}", seed / 10) for seed in (1, 2)]
    for out in outs:
        [result] = export_run(out, local_cfg(tmp_path / "store"))
        assert result.status is ExportStatus.EXPORTED, result.reason
    assert_each_run_in_its_own_folder(tmp_path / "store", outs)


def test_two_live_runs_of_long_names_each_get_their_folder(tmp_path: Path) -> None:
    root = tmp_path / "store"
    cfg = {"exporters": {"local": {"enabled": True, "root": str(root), "experiment": "x"}}}
    ids = []
    for seed in (1, 2):
        out = tmp_path / "runs" / f"{SWEEP}_seed{seed}" / "rollouts.jsonl"
        out.parent.mkdir(parents=True)
        with live_run(cfg, out) as live:
            live.export_metrics({"reward": seed}, step=0)
        [report] = live.reports
        assert report.setup_error is None and report.lost == 0, report.describe()
        ids.append(report.run_id)
    assert len(set(ids)) == 2
    for run_id in ids:
        lines = (root / "x" / run_id / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 1


# Folder names of any characters but "/" and NUL, past the shortener's limit and up to the file
# system's 255 bytes (non-UTF-8 bytes in a run's path are issue 42 item 4, checked on their own).
folder_names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=120).filter(
    lambda t: "/" not in t and "\0" not in t and t not in (".", "..") and len(t.encode()) <= 240
)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=folder_names, second=folder_names, shared=st.integers(min_value=0, max_value=120))
def test_runs_of_any_name_never_share_a_folder(
    tmp_path_factory: object, first: str, second: str, shared: int
) -> None:
    """Two runs whose folder names share any prefix (up to all of it, one level apart) keep one
    folder each, of at most 255 bytes, that their receipts verify."""
    base = Path(tmp_path_factory.mktemp("names"))  # type: ignore[attr-defined]
    second = first[:shared] + second
    while len(second.encode()) > 240:
        second = second[:-1]
    a = write_run(base / first, 0.25)
    b = write_run(base / "other" / second, 0.75)
    for out in (a, b):
        [result] = export_run(out, local_cfg(base / "store"))
        assert result.status is ExportStatus.EXPORTED, result.reason
    assert_each_run_in_its_own_folder(base / "store", [a, b])


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(max_size=400) | st.binary(max_size=400).map(os.fsdecode),
    identity=st.text("0123456789abcdef", min_size=16, max_size=64),
)
def test_a_folder_name_keeps_its_identity_suffix_whole(name: str, identity: str) -> None:
    """Any run name (any length, any bytes as the file system hands them over): the folder name is
    one safe component of at most 255 bytes ending in the whole identity suffix, and the local
    backend's path of that run id is that very name (never shortened a second time)."""
    from gym_artifacts._builtin_exporters.local import LocalExporter, LocalSettings, run_folder_name

    folder = run_folder_name(name, identity)
    assert folder.endswith(f"-{identity}")
    assert len(folder.encode()) <= 255 and "/" not in folder and folder not in (".", "..")
    exporter = LocalExporter(LocalSettings(root=Path("/r"), experiment="x"))
    assert exporter.run_dpath(folder).name == folder
