"""Secrets when the MLflow server fails: a tracking URI carrying a password, and a tracking token,
exported with ``-v --json`` to a server that answers 500 and to a closed port. The export ends
FAILED within seconds (short request timeout, no retries, short deadline); the canaries appear
nowhere: not in stdout, stderr (every log record `-v` shows, INFO and up, and every warning,
with PYTHONWARNINGS=always), the FAILED reason,
nor any file of the run folder (receipts, markers). Bounded by a subprocess timeout."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.processes import run_bounded
from tests.reliability.faulty_servers import HttpFault, http_fault

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "CANARYPW-uri-7h3k9q"
TOKEN = "CANARY-tracking-token-5m2x8w"
FAST = ["exporters.mlflow.export_request_timeout=2", "exporters.mlflow.export_request_retries=0",
        "exporters.mlflow.export_deadline=8"]  # fmt: skip


@contextmanager
def _closed_port() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: every connect is refused
    yield f"http://127.0.0.1:{port}"


@contextmanager
def _answers_500() -> Iterator[str]:
    with http_fault(HttpFault(status=500)) as (uri, _):
        yield uri


SERVERS = {"500": _answers_500, "closed-port": _closed_port}


def _files_holding(folder: Path, needles: tuple[str, ...]) -> list[str]:
    hits = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_failed_export_never_shows_uri_password_or_token(kind: str, quickstart_run: Path) -> None:
    pytest.importorskip("mlflow")
    env = {**os.environ, "PYTHONWARNINGS": "always"}
    with SERVERS[kind]() as uri:
        authed = uri.replace("http://", f"http://user:{PASSWORD}@")
        proc = run_bounded(
            [sys.executable, "-m", "gym_artifacts.cli", "-v", "export", str(quickstart_run), "-e", "mlflow", "--json",
             f"exporters.mlflow.tracking_uri={authed}", f"exporters.mlflow.tracking_token={TOKEN}", *FAST],
            capture_output=True, text=True, cwd=REPO, timeout=120, env=env,
        )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    [result] = json.loads(proc.stdout)
    assert result["status"] == "FAILED" and result["reason"], result
    # the failure was really met and talked about (the test is not vacuous)
    assert "127.0.0.1" in proc.stderr + result["reason"], proc.stderr[-2000:]
    if kind == "closed-port":  # the reason names the server, its password masked where it sat
        assert "user:***@127.0.0.1" in result["reason"], result["reason"]
    for canary in (PASSWORD, TOKEN):
        assert canary not in result["reason"], result["reason"]
        assert canary not in proc.stdout, proc.stdout
        assert canary not in proc.stderr, proc.stderr[-3000:]
    assert _files_holding(quickstart_run.parent, (PASSWORD, TOKEN)) == []
