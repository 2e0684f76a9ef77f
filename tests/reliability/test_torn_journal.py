"""A journal whose last line was torn (the disk filled at teardown, the process was killed):
every reader drops that line and says so; the run stays exportable and showable."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts.export import export_run
from gym_artifacts.exporter import ExportStatus

REPO = Path(__file__).resolve().parents[2]


def test_torn_last_journal_line_dropped_and_reported(
    quickstart_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = quickstart_run.with_name("eval_metrics.jsonl")
    steps = [json.loads(line)["step"] for line in journal.read_text().splitlines()]
    with open(journal, "a") as fh:
        fh.write('{"step": 999, "time": 17645256')  # torn: no end, no newline
    before = journal.read_bytes()
    store = tmp_path / "store"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    with caplog.at_level(logging.WARNING):
        [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    [metrics] = store.rglob("metrics.jsonl")
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == steps
    assert str(journal) in caplog.text and "partial" in caplog.text
    assert journal.read_bytes() == before  # the run file is not changed
    for command in (
        ["status", str(quickstart_run)],
        ["report", str(quickstart_run), "-o", str(tmp_path / "r.html")],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "gym_artifacts.cli", *command],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


DISK_FULL_CHILD = """
import json, resource, signal, sys
from gym_artifacts.live import live_exporters
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
with live_exporters({}, sys.argv[1], teardown_timeout=30) as live:
    for step in range(2000):
        live.export_metrics({"reward": step / 2000, "loss": 1.0}, step=step)
print(json.dumps({"lost": live.journal_lost}))
"""


def test_disk_full_journal_whole_lines_and_an_exact_loss_count(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL_CHILD, str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lost = json.loads(proc.stdout.splitlines()[-1])["lost"]
    raw = out.with_name("eval_metrics.jsonl").read_bytes()
    assert raw.endswith(b"\n")  # no torn line: a failed write was cut back
    steps = [json.loads(line)["step"] for line in raw.splitlines()]
    assert 0 < len(steps) < 2000
    assert lost == 2000 - len(steps), (lost, len(steps))  # exact: every call journaled or counted
    assert steps == list(range(len(steps)))
