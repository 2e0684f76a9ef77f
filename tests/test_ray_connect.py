"""Joining or starting a Ray cluster that fails: bounded in time, one clear line, exit 1, never a
traceback without -v (issue 27 #10: an unreachable address took 830 s, silent; issue 25: Ray's
start failure printed as a traceback). The CLI in a subprocess, bounded by its timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.processes import run_bounded
from tests.reliability.faulty_servers import black_hole

pytest.importorskip("ray")
REPO = Path(__file__).resolve().parent.parent


def export(run: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = run_bounded(
        [sys.executable, "-m", "gym_artifacts.cli", "export", str(run), "-e", "local", "--executor", "ray", *args],
        capture_output=True, text=True, timeout=timeout, cwd=run.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **(env or {})},
    )  # fmt: skip
    return proc.returncode, proc.stderr, time.monotonic() - started


def test_an_address_where_nothing_listens_fails_at_once_in_one_line(quickstart_run: Path) -> None:
    rc, err, elapsed = export(quickstart_run, "--ray-address", "127.0.0.1:1")
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("gym-artifacts: error: cannot join the Ray cluster at 127.0.0.1:1: ")
    assert elapsed < 30, elapsed  # seconds, not Ray's 14 minutes of retries
    assert not list(quickstart_run.parent.glob("*_export_done.json"))


@pytest.mark.slow
def test_a_silent_address_gives_up_after_the_connect_timeout_with_progress(quickstart_run: Path) -> None:
    with black_hole() as hole:
        address = hole.uri.removeprefix("http://")
        rc, err, elapsed = export(quickstart_run, "--ray-address", address,
                                  env={"GYM_ARTIFACTS_RAY_CONNECT_TIMEOUT": "8"})  # fmt: skip
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"joining the Ray cluster at {address} (giving up after 8 s)" in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gym-artifacts: error: cannot join the Ray cluster at {address}: no answer within 8 s"), last
    assert 8 <= elapsed < 8 + 45, elapsed  # the timeout, plus the CLI's start on a loaded machine


def test_a_ray_start_failure_is_one_line_and_exit_1_its_traceback_only_with_verbose(
    quickstart_run: Path, tmp_path: Path
) -> None:
    not_a_folder = tmp_path / "not-a-folder"
    not_a_folder.write_text("")  # Ray cannot make its session folder under it: ray.init fails
    rc, err, _ = export(quickstart_run, env={"RAY_TMPDIR": str(not_a_folder)})
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("gym-artifacts:")]
    assert lines == [lines[-1]] and lines[-1].startswith("gym-artifacts: error: cannot start a local Ray cluster: ")
    assert str(not_a_folder) in lines[-1], lines
    rc, err, _ = export(quickstart_run, "-v", env={"RAY_TMPDIR": str(not_a_folder)})
    assert rc == 1 and "Traceback" in err, err[-3000:]
    assert not list(quickstart_run.parent.glob("*_export_done.json"))
