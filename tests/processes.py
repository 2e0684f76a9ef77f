"""Subprocesses a test starts end with the test, however it ends.

A test that fails while its subprocess still runs (a ``communicate`` timeout, a failed assert
between start and wait) would leave the process running and its pipes open; the pipes' file
objects are then closed by the garbage collector during some later test, whose run pytest
fails with the "unraisable" ``ResourceWarning: unclosed file`` (issue 42, 15: nine of them
failed an innocent test of another module). ``reaped`` kills (its whole group when asked) and
reaps each process and closes its pipes when the block ends, and ``reap`` does it for one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

REAP_WAIT_S = 30.0  # a SIGKILLed process is gone in milliseconds; this only bounds a stuck reap


def reap(proc: subprocess.Popen[Any], *, group: bool = False) -> None:
    """Kill ``proc`` (or its process group) if it still runs, wait for it, close its pipes."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
    elif group:  # the leader ended; what it started in its group may still run
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(REAP_WAIT_S)


@contextlib.contextmanager
def reaped(procs: subprocess.Popen[Any] | Iterable[subprocess.Popen[Any]], *, group: bool = False) -> Iterator[None]:
    """Run the block; then ``reap`` each process (one, or a list that may still grow inside the
    block), whether the block passed, failed or timed out."""
    try:
        yield
    finally:
        for proc in [procs] if isinstance(procs, subprocess.Popen) else list(procs):
            reap(proc, group=group)


def run_bounded(
    args: Any, *, timeout: float, input: Any = None, check: bool = False, **popen: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` that leaves nothing behind: the command runs in a session of its own,
    and when it fails to end within ``timeout`` (or the caller is interrupted) it is killed with
    every process it started (its whole group), waited for, and its pipes closed, before the
    ``TimeoutExpired`` (with the output read so far) reaches the caller. A command that ends in
    time keeps what it started on purpose (a background report outliving the CLI).

    ``subprocess.run`` kills only the command on a timeout: a helper it started (an export
    worker, a server) runs on, with the command's pipes, on a machine already loaded."""
    popen.setdefault("start_new_session", True)
    if popen.pop("capture_output", False):
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    proc = subprocess.Popen(args, **popen)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        reap(proc, group=popen["start_new_session"])
        raise
    reap(proc)  # it has ended: its pipes closed here, never by the garbage collector later
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
