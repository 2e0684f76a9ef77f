"""A journal whose last line was torn (the disk filled at teardown, the process was killed):
every reader drops that line and says so; the run stays exportable and showable."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.load import scaled
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
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
        proc = run_bounded(
            [sys.executable, "-m", "gym_artifacts.cli", *command],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


DISK_FULL_CHILD = """
import json, resource, signal, sys
from gym_artifacts.live import live_run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
with live_run({}, sys.argv[1], teardown_timeout=30) as live:
    for step in range(2000):
        live.export_metrics({"reward": step / 2000, "loss": 1.0}, step=step)
print(json.dumps({"lost": live.journal_lost}))
"""


def test_disk_full_journal_whole_lines_and_an_exact_loss_count(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    proc = run_bounded(
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


@pytest.mark.parametrize("stuck", ["writes", "open"])
def test_a_journal_that_cannot_keep_up_counts_exactly_the_calls_it_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stuck: str
) -> None:
    """Teardown gives up on a journal that cannot keep up (a slow disk) or never opened (a hung
    mount): every metric call is then a line or counted lost, exactly once; the journal's own
    open and close requests are not metric calls and are never counted as lost ones."""
    import threading
    import time

    from gym_artifacts.live.journal_writer import MetricsJournal
    from gym_artifacts.run.metric_records import encode_record

    release = threading.Event()
    if stuck == "writes":
        real_append = MetricsJournal._append

        def slow_append(self: MetricsJournal, data: bytes) -> None:
            time.sleep(0.1)  # a few batches fit in the deadline, never all (within the give-up grace)
            real_append(self, data)

        monkeypatch.setattr(MetricsJournal, "_append", slow_append)
    else:
        real_open = MetricsJournal._open

        def hung_open(self: MetricsJournal, resume: bool) -> None:
            release.wait(10)
            real_open(self, resume)

        monkeypatch.setattr(MetricsJournal, "_open", hung_open)
    journal = MetricsJournal(tmp_path / "eval_metrics.jsonl", resume=False)
    calls = 20_000
    for step in range(calls):
        journal.append_record(encode_record({"loss": 0.5}, step, 1.0))
    started = time.monotonic()
    assert journal.close(timeout=0.5) is False  # gave up: the writes could not keep up
    release.set()
    assert time.monotonic() - started < scaled(8)
    stats = journal.worker.stats
    lost = stats.dropped + stats.failed + stats.undelivered
    fpath = tmp_path / "eval_metrics.jsonl"
    lines = fpath.read_bytes().count(b"\n") if fpath.exists() else 0
    assert 0 < lost <= calls
    assert lines + lost == calls, (lines, lost)
