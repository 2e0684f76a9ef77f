"""Servers that never answer: a TCP black hole and a server that drips one byte a second. With
the default request timeouts and retries (minutes), the post-run export still ends FAILED within
its overall deadline (``exporters.mlflow.export_deadline``), with a one-line reason, no receipt,
and the CLI exits; the time is bounded by the subprocess timeout (a hang fails the test)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.processes import run_bounded
from tests.reliability.faulty_servers import black_hole, drip_server

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 8
SERVERS: dict[str, Callable[[], AbstractContextManager[Any]]] = {"black-hole": black_hole, "drip": drip_server}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_export_ends_failed_within_the_deadline(kind: str, quickstart_run: Path) -> None:
    pytest.importorskip("mlflow")
    with SERVERS[kind]() as server:
        started = time.monotonic()
        proc = run_bounded(
            [sys.executable, "-m", "gym_artifacts.cli", "export", str(quickstart_run), "-e", "mlflow", "--json",
             f"exporters.mlflow.tracking_uri={server.uri}", f"exporters.mlflow.export_deadline={DEADLINE}"],
            capture_output=True, text=True, cwd=REPO, timeout=DEADLINE + 90,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    [result] = json.loads(proc.stdout)
    assert result["status"] == "FAILED"
    assert "\n" not in result["reason"] and "deadline" in result["reason"], result["reason"]
    # the deadline, plus the CLI's start (imports) on a loaded machine
    assert elapsed < DEADLINE + 45, elapsed
    assert not quickstart_run.with_name("eval_mlflow_export_done.json").exists()
