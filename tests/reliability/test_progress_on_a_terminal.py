"""Issue 42 (13): long work shows progress on a terminal, a line that updates while it lasts
(quiet off a terminal), including the time spent waiting for another export's lock.

The CLI runs as a real subprocess on a pseudo-terminal (``os.openpty``, with a window size as a
terminal has: a pty without one is zero columns wide). The work is made long by the server, not
by the run's size: a real ``mlflow server`` behind a proxy that holds ``runs/create`` for a few
seconds, or a lock on the run that this test holds until it has seen the CLI say it waits for it
(an event, never a sleep), so each test takes seconds whatever the machine's load."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.core.locking import try_lock
from gym_artifacts.run.artifacts import RunArtifacts
from tests.conftest import copy_quickstart
from tests.load import scaled
from tests.processes import reap
from tests.reliability.faulty_servers import DelayingProxy, proxy

REPO = Path(__file__).resolve().parents[2]
TABLE_HEADER = b"exporter  status"
ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


def on_a_terminal(argv: list[str], cwd: Path, timeout: float, seen: Callable[[bytes], None] | None = None) -> tuple[int | None, bytes]:
    """Run ``argv`` with stdin, stdout and stderr on a 120x40 pty; ``seen(output so far)`` after
    each read. Returns (exit code, everything written); the group is killed at ``timeout``."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    finally:
        os.close(slave)
    output = b""
    try:
        bound = time.monotonic() + timeout
        while time.monotonic() < bound:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the other side closed: the command ended
                    break
                if not data:
                    break
                output += data
                if seen is not None:
                    seen(output)
            elif proc.poll() is not None:
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        return proc.returncode, output
    finally:
        reap(proc, group=True)
        os.close(master)


def frames(output: bytes) -> list[bytes]:
    """The distinct lines the terminal showed before the result table (each ``\\r`` redraws)."""
    before = output.split(TABLE_HEADER, 1)[0]
    shown = [ANSI.sub(b"", part).strip() for part in re.split(rb"[\r\n]", before)]
    return list(dict.fromkeys(f for f in shown if f))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gym_artifacts.cli", "export", *args]


def test_a_long_mlflow_export_shows_a_line_that_updates(tmp_path: Path, mlflow_server: Any) -> None:
    """The server holds runs/create for 6 s: while it does, the terminal shows which backend
    is being exported to, redrawn as the time passes; then the result table."""
    run = copy_quickstart(tmp_path / "runs")
    policy = DelayingProxy(mlflow_server.uri, "/runs/create", delay=6.0)
    with proxy(policy) as uri:
        code, output = on_a_terminal(
            cli(str(run), "-e", "mlflow", f"exporters.mlflow.tracking_uri={uri}", "exporters.mlflow.report=off",
                f"exporters.mlflow.experiment_name=progress-{uuid.uuid4().hex}"),
            tmp_path, scaled(120),
        )  # fmt: skip
    assert code == 0, output[-3000:]
    assert TABLE_HEADER in output, output[-3000:]
    shown = [f for f in frames(output) if b"mlflow" in f]
    assert len(shown) >= 3, frames(output)  # the line was redrawn while the server held the request


@pytest.mark.slow
def test_waiting_for_another_exports_lock_is_shown_and_updates(tmp_path: Path) -> None:
    """Another process holds the run's export lock: the terminal says the export waits for it
    and for whom (the holder's pid), redrawn while it waits; once the lock is released (by this
    test, after it saw the line) the export goes on and EXPORTED."""
    run = copy_quickstart(tmp_path / "runs")
    held, _ = try_lock(RunArtifacts.from_path(run).export_lock_fpath("local"))
    assert held is not None
    waits: list[float] = []

    def seen(output: bytes) -> None:
        shown = [f for f in frames(output) if b"waiting" in f]
        if len(shown) >= 3 and held.fd is not None:  # seen redrawn: let the export go on
            waits.append(time.monotonic())
            held.release()

    try:
        code, output = on_a_terminal(
            cli(str(run), "-e", "local", f"exporters.local.root={tmp_path / 'store'}", "exporters.local.report=off"),
            tmp_path, scaled(90), seen,
        )  # fmt: skip
    finally:
        held.release()
    assert waits, frames(output)  # the wait was shown (else the lock was held until the timeout)
    assert code == 0, output[-3000:]
    waiting = [f for f in frames(output) if b"waiting" in f]
    assert any(str(os.getpid()).encode() in f for f in waiting), waiting
    assert b"EXPORTED" in output


@pytest.mark.slow
def test_off_a_terminal_the_wait_prints_nothing(tmp_path: Path) -> None:
    """The same wait with stderr a pipe: no progress line at all (a log stays clean)."""
    run = copy_quickstart(tmp_path / "runs")
    lock = RunArtifacts.from_path(run).export_lock_fpath("local")
    held, _ = try_lock(lock)
    assert held is not None
    proc = subprocess.Popen(
        cli(str(run), "-e", "local", f"exporters.local.root={tmp_path / 'store'}", "exporters.local.report=off"),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(3)  # a wait to be shown, had it been a terminal (no event to wait for: nothing is printed)
        held.release()
        _, err = proc.communicate(timeout=scaled(60))
    finally:
        held.release()
        reap(proc)
    assert proc.returncode == 0, err[-2000:]
    assert b"waiting" not in err and b"\r" not in err, err[-2000:]
