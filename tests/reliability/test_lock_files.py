"""A run's lock files are never written through a link or into a
special file, and none is left beside a run once a command finished -- while two exporters that
race for one lock still take turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym_artifacts.core.locking import exclusive_lock, try_lock
from gym_artifacts.run.artifacts import RunArtifacts
from tests.processes import reaped, run_bounded

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return run_bounded([sys.executable, "-m", "gym_artifacts.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=timeout)  # fmt: skip


@pytest.mark.parametrize("kind", ["export", "live"])
def test_a_lock_that_is_a_symlink_is_never_written_through(
    quickstart_run: Path, tmp_path: Path, kind: str
) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    lock = run.export_lock_fpath("local") if kind == "export" else run.live_writer_lock_fpath()
    lock.symlink_to(victim)
    if kind == "export":
        proc = cli(
            "export", str(quickstart_run), "-e", "local", "--json", f"exporters.local.root={tmp_path / 's'}"
        )
        [result] = json.loads(proc.stdout)
        assert result["status"] == "FAILED" and "not a regular file" in result["reason"], proc.stdout
    else:
        from omegaconf import OmegaConf

        from gym_artifacts.live import live_run

        with live_run(OmegaConf.create({"exporters": {}}), quickstart_run) as live:
            assert live.writer_refused is not None and "not a regular file" in live.writer_refused
    assert victim.read_text() == "keep me\n"
    assert lock.is_symlink()  # the user's link is theirs: reported, never removed or followed


def test_a_lock_that_is_a_fifo_never_blocks(quickstart_run: Path, tmp_path: Path) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    os.mkfifo(run.export_lock_fpath("local"))
    proc = cli("export", str(quickstart_run), "-e", "local", "--json", f"exporters.local.root={tmp_path / 's'}",
               timeout=60)  # fmt: skip
    [result] = json.loads(proc.stdout)
    assert result["status"] == "FAILED" and "not a regular file" in result["reason"]


def test_no_lock_file_remains_after_an_export_or_a_live_run(quickstart_run: Path, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from gym_artifacts.live import live_run

    proc = cli(
        "export", str(quickstart_run), "-e", "local", "--json", f"exporters.local.root={tmp_path / 's'}"
    )
    assert json.loads(proc.stdout)[0]["status"] == "EXPORTED", proc.stderr[-2000:]
    out = tmp_path / "live" / "eval.jsonl"
    out.parent.mkdir()
    with live_run(OmegaConf.create({"exporters": {}}), out) as live:
        live.export_metrics({"x": 1.0}, step=0)
    leftovers = [
        p.name for p in [*quickstart_run.parent.iterdir(), *out.parent.iterdir()] if p.name.endswith(".lock")
    ]
    assert leftovers == []


HOLDER = """
import sys, time
from pathlib import Path
from gym_artifacts.core.locking import exclusive_lock
lock, log, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with exclusive_lock(lock, wait_seconds=60, poll=0.001):
        with log.open("a") as fh:
            fh.write("in\\n")
        time.sleep(0.001)
        with log.open("a") as fh:
            fh.write("out\\n")
"""


def test_two_exporters_racing_for_a_removed_lock_never_hold_it_at_once(tmp_path: Path) -> None:
    """Each holder removes the lock file on release; one that opened the old file meanwhile
    must notice it locked a removed file and take the new one, never run alongside."""
    lock, log = tmp_path / "OUT_local_export.lock", tmp_path / "log"
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(log), "150"], cwd=REPO)
        for _ in range(3)
    ]
    with reaped(procs):
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    lines = log.read_text().split()
    assert len(lines) == 3 * 150 * 2
    assert lines == ["in", "out"] * (3 * 150), "two holders were inside the lock at once"
    assert not lock.exists()


def test_exclusive_lock_in_process_is_released_and_removed(tmp_path: Path) -> None:
    lock = tmp_path / "a.lock"
    with exclusive_lock(lock):
        assert lock.is_file()
        held, holder = try_lock(lock)
        assert held is None and str(os.getpid()) in holder
    assert not lock.exists()


@pytest.mark.parametrize("mode", ["ab", "wb", "rb+"])
def test_open_regular_refuses_links_fifos_and_folders(tmp_path: Path, mode: str) -> None:
    from gym_artifacts.core.atomic import open_regular

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "link").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("link", "fifo", "dir"):
        with pytest.raises(OSError, match="not a regular file"):
            open_regular(tmp_path / name, mode)
    assert victim.read_bytes() == b"keep"


def test_a_journal_planted_as_a_link_is_not_written_through(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from gym_artifacts.live import live_run

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / "run" / "eval.jsonl"
    out.parent.mkdir()
    out.with_name("eval_metrics.jsonl").symlink_to(victim)
    with live_run(OmegaConf.create({"exporters": {}}), out, teardown_timeout=5) as live:
        live.export_metrics({"x": 1.0}, step=0)
    assert victim.read_text() == "keep\n"
