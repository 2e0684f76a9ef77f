"""MLflow's own server on a database store, for the duration of one trace export.

A database store (``sqlite:///``...) has no OTLP endpoint of its own and MLflow's public Python
tracing calls write to the process-wide tracking URI, so traces for such a store go through
``mlflow server`` started on it (127.0.0.1, a free port, one worker): the same public requests as
to any server, and no MLflow table is written by this project.

The server runs under a small guard process that reads a pipe from the exporter: when the
exporter ends in any way (SIGKILL included) the pipe closes and the guard kills the server's
whole process group, so no server outlives its export.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

START_TIMEOUT_S = 180.0  # a loaded 2-core machine takes ~10-60 s to start MLflow's server

# Runs the server in its own session and kills that session's process group once stdin closes
# (the exporter ended) or the server exits.
_GUARD = r"""
import os, signal, subprocess, sys, threading
log = open(sys.argv[1], "ab")
server = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          start_new_session=True)
def watch():
    sys.stdin.buffer.read()
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
threading.Thread(target=watch, daemon=True).start()
sys.exit(server.wait())
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mlflow_command(store_uri: str, port: int, artifacts: Path) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", store_uri, "--artifacts-destination", str(artifacts),
    ]  # fmt: skip


@contextlib.contextmanager
def trace_server(
    store_uri: str, timeout: float = START_TIMEOUT_S, remaining: Callable[[], float | None] = lambda: None
) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an ``mlflow server`` on ``store_uri`` while the block runs.

    ``remaining``: the export's time left (None: no deadline), asked while waiting for the server
    to start; it raises once the export's deadline has passed, which ends the wait (and the
    server) at the deadline rather than at ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="gym-artifacts-mlflow-server-") as tmp:
        port = _free_port()
        log = Path(tmp) / "server.log"
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
        cmd = [sys.executable, "-c", _GUARD, str(log), *_mlflow_command(store_uri, port, Path(tmp) / "art")]
        guard = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(guard, url, log, timeout, remaining)
            yield url
        finally:
            assert guard.stdin is not None
            guard.stdin.close()  # the guard kills the server's group
            try:
                guard.wait(30)
            except subprocess.TimeoutExpired:
                guard.kill()
                guard.wait(30)


def _wait_healthy(
    guard: subprocess.Popen[bytes], url: str, log: Path, timeout: float, remaining: Callable[[], float | None]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if guard.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {log.read_text(errors='replace')[-2000:]}")
        left = remaining()  # raises at the export's deadline
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2 if left is None else min(2, left)) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"mlflow server not ready in {timeout:g} s: {log.read_text(errors='replace')[-2000:]}")
