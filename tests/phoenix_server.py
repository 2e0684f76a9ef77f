"""A real ``phoenix serve`` on 127.0.0.1 for tests: its own venv, SQLite working directory, free
ports, health wait, killed by process group.

The Phoenix server cannot share a virtual environment with MLflow (their graphql-core pins
conflict), so it runs from its own: ``$GYM_ARTIFACTS_PHOENIX_BIN``, else ``.venv-phoenix`` in the
checkout (``.ci/run`` builds it), else ``/work/venv-phoenix``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.mlflow_server import free_port

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = (REPO / ".venv-phoenix" / "bin" / "phoenix", Path("/work/venv-phoenix/bin/phoenix"))


def phoenix_bin() -> Path | None:
    """The ``phoenix`` executable to run, or None when this machine has none."""
    given = os.environ.get("GYM_ARTIFACTS_PHOENIX_BIN")
    if given:
        return Path(given)
    return next((p for p in CANDIDATES if p.is_file()), None)


@dataclass
class PhoenixServer:
    """One ``phoenix serve`` process group with its SQLite database under ``root``."""

    root: Path
    binary: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "phoenix.log"

    def start(self, timeout: float = 300.0) -> PhoenixServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = dict(
            os.environ,
            PHOENIX_WORKING_DIR=str(self.root),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(self.port),
            PHOENIX_GRPC_PORT=str(free_port()),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout  # a loaded 2-core machine takes ~100 s to import it
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"phoenix serve not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None
