"""Issue 27 (3, 5, 6, 7, 11): run arguments, config resolution errors, lone surrogates, long stems
and interpolation chains: each a clear message or a per-backend result, never a traceback, a
write outside the run, or a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "gym_artifacts.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)  # fmt: skip


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")}


@pytest.mark.parametrize("argument", ["", " ", ".", "./", "..", "runs/.", "runs"])
@pytest.mark.parametrize("command", ["export", "status", "report"])
def test_run_arguments_that_name_no_run_exit_2(quickstart_run: Path, tmp_path: Path, argument: str, command: str) -> None:
    work = quickstart_run.parent  # the working folder is a folder of runs; its parent gets nothing either
    (work / "runs").mkdir()
    shutil.copy(quickstart_run, work / "runs" / "x.jsonl")
    (work / "runs" / "x_aggregate_metrics.json").write_text("[]")
    before, before_parent = tree(work), tree(work.parent)
    extra = ["-e", "local", f"exporters.local.root={tmp_path / 'store'}"] if command == "export" else []
    proc = cli(command, argument, *extra, cwd=work)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
    assert "no run at" in proc.stderr and "Traceback" not in proc.stderr
    assert tree(work) == before and tree(work.parent) == before_parent
    assert not (tmp_path / "store").exists()
