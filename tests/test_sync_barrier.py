"""One durability barrier for a folder's files: inside ``sync_barrier()`` each file is still
published whole under its final name at once, and the waits come together at the end (every
file, then each folder once) instead of two per file; an export's FINISHED status and receipt
come after the barrier."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.core.atomic import TEMP_PREFIX, atomic_write_bytes, sync_barrier


class FsyncLog:
    """Every ``os.fsync`` of the block, as ('file' | 'dir', path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        real = os.fsync

        def logged(fd: int) -> None:
            kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path.name.startswith(TEMP_PREFIX):  # fsynced before its rename: log its final name
                path = path.with_name(path.name.split("-", 3)[3])
            self.calls.append((kind, str(path)))
            real(fd)

        monkeypatch.setattr(os, "fsync", logged)

    def of(self, kind: str) -> list[str]:
        return [path for k, path in self.calls if k == kind]


names = st.lists(st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True), min_size=1, max_size=30, unique=True)


@settings(max_examples=20, deadline=None)
@given(files=names, folders=st.integers(min_value=1, max_value=4))
def test_a_barrier_waits_once_per_file_and_once_per_folder(
    tmp_path_factory: pytest.TempPathFactory, files: list[str], folders: int
) -> None:
    root = tmp_path_factory.mktemp("barrier")
    with pytest.MonkeyPatch.context() as mp:
        log = FsyncLog(mp)
        with sync_barrier():
            for i, name in enumerate(files):
                fpath = root / f"d{i % folders}" / name
                atomic_write_bytes(fpath, name.encode() * 3)
                assert fpath.read_bytes() == name.encode() * 3  # whole under its name at once
            assert log.calls == []  # no wait inside the barrier
    expected_files = {str(root / f"d{i % folders}" / n) for i, n in enumerate(files)}
    assert sorted(log.of("file")) == sorted(expected_files)
    assert sorted(log.of("dir")) == sorted({str(Path(p).parent) for p in expected_files})
    assert log.calls[-len(log.of("dir")) :] == [("dir", d) for d in log.of("dir")]  # folders last


def test_a_barrier_left_by_an_exception_waits_for_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = FsyncLog(monkeypatch)
    with pytest.raises(RuntimeError), sync_barrier():
        atomic_write_bytes(tmp_path / "a", b"x")
        raise RuntimeError("the export failed: it claims nothing, so it waits for nothing")
    assert log.calls == []
    atomic_write_bytes(tmp_path / "b", b"y")  # outside any barrier: a wait of its own again
    assert log.of("file") and log.of("dir")


def test_a_replaced_file_in_a_barrier_is_synced_as_its_last_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FsyncLog(monkeypatch)
    with sync_barrier(), sync_barrier():  # a nested barrier joins the outer one
        for i in range(5):
            atomic_write_bytes(tmp_path / "same", str(i).encode())
    assert log.of("file") == [str(tmp_path / "same")]
    assert (tmp_path / "same").read_bytes() == b"4"


def test_a_local_export_waits_once_per_folder(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    log = FsyncLog(monkeypatch)
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store), "report": "off"}}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    folder = store / "default" / result.backend_run_id
    published = [p for p in folder.rglob("*") if p.is_file()]
    # A cold export writes into ``.sending-<name>-<key>/`` and renames it to the identity's folder
    # once the identity is known (hashing while sending): an fsync follows the inode, so a file
    # synced under the sending folder is durable under its published name.
    sending = sorted({Path(p).relative_to(folder.parent).parts[0] for k, p in log.calls
                      if p.startswith(str(folder.parent / ".sending-"))})  # fmt: skip
    assert len(sending) <= 1, sending

    def published_name(path: str) -> str:
        return path.replace(str(folder.parent / sending[0]), str(folder), 1) if sending else path

    log.calls = [(kind, published_name(path)) for kind, path in log.calls]
    synced = set(log.of("file"))
    assert {str(p) for p in published} <= synced  # every published file is durable ...
    dirs = log.of("dir")
    per_folder = {d: dirs.count(d) for d in dirs}
    # ... with one wait per folder, plus one per later run.json and the receipt's own
    assert per_folder.pop(str(folder)) <= 3
    assert all(n == 1 for d, n in per_folder.items() if d.startswith(str(folder))), per_folder
    receipt = quickstart_run.with_name("eval_local_export_done.json")
    last_run_json = max(i for i, (k, p) in enumerate(log.calls) if p == str(folder / "run.json"))
    last_data = max(i for i, (k, p) in enumerate(log.calls) if p.endswith("rollouts.jsonl"))
    assert last_data < last_run_json  # FINISHED is durable only after the data
    assert any(p == str(receipt) for p in log.of("file"))
