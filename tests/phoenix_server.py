"""A real ``phoenix serve`` on 127.0.0.1 for tests: its own venv, SQLite working directory, free
ports, health wait, killed by process group.

The Phoenix server cannot share a virtual environment with MLflow (their graphql-core pins
conflict), so it runs from its own: ``$GYM_ARTIFACTS_PHOENIX_BIN``, else ``.venv-phoenix`` in the
checkout (``scripts/test.sh`` builds it).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.server_process import free_port, kill_process_group, start_process_group

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = (REPO / ".venv-phoenix" / "bin" / "phoenix",)


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
        # a loaded 2-core machine takes ~100 s to import it
        self.proc = start_process_group(
            [str(self.binary), "serve"], env, self.log, f"{self.url}/healthz", timeout, poll_s=0.5
        )
        return self

    def stop(self) -> None:
        kill_process_group(self.proc)
        self.proc = None
