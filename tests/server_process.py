"""A test server in its own process group: a free port, a health wait, a kill of the whole group.

``tests/mlflow_server.py`` and ``tests/phoenix_server.py`` start their real servers through this
one helper, so both fail the same way: an exit or a missing health answer raises with the tail
of the server's log, and a server that never got healthy is killed, never left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_process_group(
    cmd: list[str], env: dict[str, str], log: Path, health_url: str, timeout: float, poll_s: float = 0.2
) -> subprocess.Popen[bytes]:
    """Run ``cmd`` in a new session (its own process group), output appended to ``log``; return
    once ``health_url`` answers 200. Raises RuntimeError naming the log's tail when the process
    exits first or is not healthy within ``timeout`` seconds; the group is killed whenever this
    raises (Ctrl-C during the wait too)."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    name = Path(cmd[0]).name
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(health_url, timeout=1) as resp:
                    if resp.status == 200:
                        return proc
            except OSError:
                time.sleep(poll_s)
        raise RuntimeError(f"{name} not ready in {timeout}s: {log.read_text(errors='replace')[-2000:]}")
    except BaseException:  # not healthy, or the wait interrupted (Ctrl-C): the group never outlives it
        kill_process_group(proc)
        raise


def kill_process_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the process's whole group (a server's workers too) and reap it."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
