"""Ctrl-C during an export prints every result that finished, ``--json`` included:
a backend EXPORTED with its receipt is never reported as cancelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gym_artifacts.run.artifacts import RunArtifacts
from tests.load import scaled
from tests.processes import reaped
from tests.reliability.faulty_servers import black_hole

REPO = Path(__file__).resolve().parents[2]


# 0 s: the signal lands as soon as the receipt exists, most likely while the local backend still
# builds its report after it (the result must be recorded before that work); 1 s: in MLflow's request.
@pytest.mark.parametrize("after_receipt_s", [0.0, 1.0])
def test_ctrl_c_prints_the_backends_that_finished(quickstart_run: Path, tmp_path: Path, after_receipt_s: float) -> None:
    receipt = RunArtifacts.from_path(quickstart_run).export_done_fpath("local")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    with black_hole() as hole:  # MLflow's server accepts and never answers: the export waits there
        proc = subprocess.Popen(
            [sys.executable, "-m", "gym_artifacts.cli", "export", str(quickstart_run), "--json",
             "-e", "local", "-e", "mlflow", f"exporters.local.root={tmp_path / 'store'}",
             f"exporters.mlflow.tracking_uri={hole.uri}"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        with reaped(proc):
            deadline = time.monotonic() + scaled(120)
            while not receipt.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert receipt.exists(), proc.communicate(timeout=scaled(5))
            time.sleep(after_receipt_s)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 130, err[-2000:]
    results = json.loads(out)
    assert [(r["exporter"], r["status"]) for r in results] == [("local", "EXPORTED")], (out, err[-2000:])
    assert "only in part" in err


REPORT_HANGS = """
import sys, time
from pathlib import Path
import gym_artifacts.plugin as plugin
def building_report(job):
    Path({marker!r}).write_text("building")
    time.sleep(120)
plugin.build_report_job = building_report
from gym_artifacts.cli import main
sys.exit(main(["export", {run!r}, "--json", "-e", "local", "exporters.local.root={store}"]))
"""


def test_ctrl_c_during_the_report_after_every_export_finished_cancels_no_run(
    quickstart_run: Path, tmp_path: Path
) -> None:
    """Every backend of the run exported and wrote its receipt; Ctrl-C lands while the local
    report is built after it: the run is EXPORTED and reported so, and stderr names what was cut
    (the work after the export), never the run as cancelled or exported only in part."""
    marker = tmp_path / "report-started"
    script = REPORT_HANGS.format(marker=str(marker), run=str(quickstart_run), store=tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    with reaped(proc):
        deadline = time.monotonic() + scaled(120)
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), proc.communicate(timeout=scaled(5))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 130, err[-2000:]
    assert [(r["exporter"], r["status"]) for r in json.loads(out)] == [("local", "EXPORTED")]
    assert "not exported" not in err and "only in part" not in err, err[-2000:]
    assert "interrupted after every export finished" in err, err[-2000:]


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    """``module.name`` does its work, then Ctrl-C lands (as a signal handler raises it)."""
    original = getattr(module, name)

    def then_interrupted(*args: object, **kwargs: object) -> object:
        original(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, then_interrupted)


@pytest.mark.parametrize("landing", ["publish_receipt", "_redacted", "logger.info"])
def test_ctrl_c_anywhere_after_the_receipt_reports_the_backend_exported(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landing: str
) -> None:
    """Whatever instruction the signal interrupts once the receipt is written, the backend is
    reported EXPORTED with its run id: its receipt is on disk, the next export will skip it."""
    from omegaconf import OmegaConf

    from gym_artifacts.export import engine

    if landing == "logger.info":
        original_info = engine.logger.info

        def info(msg: str, *args: object) -> None:
            original_info(msg, *args)
            if msg.startswith("%s: %s %s"):  # the line that follows the backend's result
                raise KeyboardInterrupt

        monkeypatch.setattr(engine.logger, "info", info)
    else:
        _interrupt_after(monkeypatch, engine, landing)
    finished: list = []
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}})
    with pytest.raises(KeyboardInterrupt):
        engine.export_run(quickstart_run, cfg, ["local"], on_result=finished.append)
    receipt = RunArtifacts.from_path(quickstart_run).export_done_fpath("local")
    assert receipt.exists()
    assert [(r.exporter, r.status.value) for r in finished] == [("local", "EXPORTED")]
    assert finished[0].backend_run_id
