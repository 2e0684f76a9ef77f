"""What the live API says about itself: readable reprs of ``LiveRun`` and its report objects, and
one INFO line at teardown naming what each backend got (delivered/failed/undelivered)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from gym_artifacts.live.fanout import NoOpLiveRun, live_run

ADDRESS = re.compile(r" object at 0x[0-9a-f]+")


def _config(tmp_path: Path) -> dict:
    return {
        "exporters": {
            "local": {"enabled": True, "root": str(tmp_path / "store")},
            "tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")},
        }
    }


def test_reprs_say_what_the_objects_hold(tmp_path: Path) -> None:
    out = tmp_path / "run" / "eval.jsonl"
    with live_run(_config(tmp_path), out) as live:
        live.export_metrics({"reward": 0.5}, step=1)
        live.export_metrics(None)  # type: ignore[arg-type]
        live.export_metrics({"reward": 0.6}, step="x")  # type: ignore[arg-type]
        texts = {"run": repr(live), "refused": repr(live.refused), "refused str": str(live.refused)}
    texts["reports"] = repr(live.reports)
    texts["closed run"] = repr(live)
    for name, text in texts.items():
        assert not ADDRESS.search(text), (name, text)
    assert "eval.jsonl" in texts["run"] and "local" in texts["run"] and "tensorboard" in texts["run"]
    assert "open" in texts["run"] and "closed" in texts["closed run"]
    assert "2 refused" in texts["refused"] and "step" in texts["refused"], texts["refused"]
    assert "delivered=" in texts["reports"]
    assert not ADDRESS.search(repr(NoOpLiveRun("another writer holds it")))
    assert "another writer holds it" in repr(NoOpLiveRun("another writer holds it"))


def test_teardown_logs_one_summary_line_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run" / "eval.jsonl"
    with caplog.at_level(logging.INFO, logger="gym_artifacts"):
        with live_run(_config(tmp_path), out) as live:
            for step in range(3):
                live.export_metrics({"reward": step / 3}, step=step)
        summaries = [r for r in caplog.records if r.getMessage().startswith("live logging: teardown:")]
    assert len(summaries) == 1, [r.getMessage() for r in caplog.records]
    [record] = summaries
    assert record.levelno == logging.INFO
    line = record.getMessage()
    assert "\n" not in line
    for report in live.reports:  # the counts the reports hold, per backend
        assert f"{report.exporter} {report.delivered} delivered, {report.failed} failed, {report.undelivered} undelivered" in line, line
    assert {r.exporter for r in live.reports} == {"local", "tensorboard"}
    assert all(r.delivered > 0 for r in live.reports)
