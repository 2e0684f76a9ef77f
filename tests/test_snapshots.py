"""Exports are snapshots: later writes to the run never reach an export, edits to an export never
reach the run, and no exported (or staged) file shares an inode with the run."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.core.jsonio import read_json
from gym_artifacts.core.snapshot import snapshot_copy
from gym_artifacts.run.identity import identity_of
from tests.mlflow_store import mlflow_sqlite

METHODS = ["reflink", "copy_file_range", "sendfile", "read", None]


def run_files(run: Path) -> dict[Path, bytes]:
    """Every file of the run (rollouts, siblings, artifacts) with its bytes."""
    files = [p for p in run.parent.rglob("*") if p.is_file() and p.name.startswith("eval")]
    files += [p for p in run.with_name("eval_artifacts").rglob("*") if p.is_file()]
    return {p: p.read_bytes() for p in files}


def inodes(paths: list[Path]) -> set[tuple[int, int]]:
    return {(p.stat().st_dev, p.stat().st_ino) for p in paths}


def exported_copies(folder: Path) -> dict[str, Path]:
    """Exported files that are byte copies of run artifacts, by their identity name."""
    copies = {name: folder / name for name in ("rollouts.jsonl", "aggregate_metrics.json")}
    for p in (folder / "artifacts").rglob("*"):
        if p.is_file():
            copies[f"artifacts/{p.relative_to(folder / 'artifacts').as_posix()}"] = p
    return copies


def assert_matches_run_json(folder: Path) -> None:
    stated = read_json(folder / "run.json")["identities"]
    copies = exported_copies(folder)
    assert len(copies) >= 5
    for name, fpath in copies.items():
        assert identity_of(fpath) == stated[name], name


def test_a_local_export_is_a_snapshot_both_ways(quickstart_run: Path, tmp_path: Path) -> None:
    cfg = {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}}
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    folder = tmp_path / "store" / "default" / result.backend_run_id
    exported = [p for p in folder.rglob("*") if p.is_file()]
    assert not inodes(exported) & inodes(list(run_files(quickstart_run)))
    assert_matches_run_json(folder)

    # The run changes after its export: a resumed eval appends, a byte is rewritten in place.
    with open(quickstart_run, "ab") as fh:
        fh.write(b'{"resumed": true}\n')
    recording = quickstart_run.with_name("eval_artifacts") / "recording.mp4"
    with open(recording, "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert_matches_run_json(folder)
    os.truncate(quickstart_run, 10)
    assert_matches_run_json(folder)

    # Editing the export changes no run file.
    before = run_files(quickstart_run)
    with open(folder / "rollouts.jsonl", "ab") as fh:
        fh.write(b'{"edited": true}\n')
    with open(folder / "artifacts" / "recording.mp4", "r+b") as fh:
        fh.write(b"\0\0\0\0")
    assert run_files(quickstart_run) == before


@pytest.mark.slow
def test_files_staged_for_mlflow_share_no_inode_with_the_run(quickstart_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = mlflow_sqlite(tmp_path / 'm.db')
    artifacts = tmp_path / "mlflow-artifacts"
    cfg = {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "artifact_location": str(artifacts)}}}
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    stored = [p for p in artifacts.rglob("*") if p.is_file()]
    assert any(p.name == "rollouts.jsonl" for p in stored)
    assert not inodes(stored) & inodes(list(run_files(quickstart_run)))
    assert MlflowClient(uri).get_run(result.backend_run_id).info.status == "FINISHED"


@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=300_000), method=st.sampled_from(METHODS))
def test_snapshot_copy_is_an_independent_byte_copy(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                                   method: str | None) -> None:  # fmt: skip
    folder = tmp_path_factory.mktemp("snap")
    src, dst = folder / "src.bin", folder / "out" / "dst.bin"
    src.write_bytes(data)
    assert snapshot_copy(src, dst, method) == len(data)
    assert dst.read_bytes() == data and src.stat().st_ino != dst.stat().st_ino
    with open(src, "ab") as fh:
        fh.write(b"more")
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_an_old_hard_linked_export_is_replaced_by_a_copy(tmp_path: Path) -> None:
    src = tmp_path / "run.jsonl"
    src.write_bytes(b'{"a": 1}\n')
    dst = tmp_path / "export" / "rollouts.jsonl"
    dst.parent.mkdir()
    os.link(src, dst)  # what an older release left behind
    snapshot_copy(src, dst)
    assert not os.path.samefile(src, dst) and dst.read_bytes() == src.read_bytes()
