"""Start-up: ``gym-artifacts exporters`` and the export of an already exported run, wall time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Row, best_of, make_run


def _cli(*args: str) -> None:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    subprocess.run(
        [sys.executable, "-m", "gym_artifacts.cli", *args], check=True, capture_output=True, env=env
    )


def run(tiny: bool) -> list[Row]:
    repeat = 2 if tiny else 5
    python = best_of(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeat)
    listing = best_of(lambda: _cli("exporters"), repeat)
    with tempfile.TemporaryDirectory(prefix="gymart-bench-start-") as tmp_name:
        tmp = Path(tmp_name)
        out = make_run(tmp / "run", 2_000_000, 1_000_000)
        local = ["-e", "local", f"exporters.local.root={tmp / 'store'}", "exporters.local.report=off"]
        _cli("export", str(out), *local)
        skipped = best_of(lambda: _cli("export", str(out), *local), repeat)
    return [
        Row(
            "start-up: gym-artifacts exporters",
            f"{listing:.2f} s",
            f"python -c pass {python:.2f} s",
            listing / python,
            "< 0.5 s",
            listing < 0.5,
        ),
        Row(
            "start-up: export of an exported run",
            f"{skipped:.2f} s",
            f"python -c pass {python:.2f} s",
            skipped / python,
            "< 0.5 s",
            skipped < 0.5,
        ),
    ]
