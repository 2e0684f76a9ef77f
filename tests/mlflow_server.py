"""A real ``mlflow server`` on 127.0.0.1 for tests: free port, health wait, killed by process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MlflowServer:
    """One server process group serving a SQLite store and a local artifact folder."""

    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        return self.root / "server.db"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def start(self, timeout: float = 60.0) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        cmd = [
            str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.db}", "--artifacts-destination", str(self.artifacts),
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """Kill the whole process group (uvicorn's child too) and wait for it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None
