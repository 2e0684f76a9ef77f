"""A real ``mlflow server`` on 127.0.0.1 for tests: free port, health wait, killed by process group."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.server_process import free_port as free_port  # re-exported: tests import it from here
from tests.server_process import kill_process_group, start_process_group


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

    def start(self, timeout: float = 180.0) -> MlflowServer:  # a wait, not a cost: a loaded CI host is slow
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        cmd = [
            str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.db}", "--artifacts-destination", str(self.artifacts),
        ]  # fmt: skip
        self.proc = start_process_group(cmd, env, self.log, f"{self.uri}/health", timeout)
        return self

    def stop(self) -> None:
        """Kill the whole process group (uvicorn's child too) and wait for it."""
        kill_process_group(self.proc)
        self.proc = None
