"""The live metrics journal's writer: appends ``STEM_metrics.jsonl`` lines off the eval's thread.

Written on its own background worker (the caller only enqueues), one complete JSON line per
metric call, flushed after every batch, so a killed process leaves every written line readable.
The line format and the reader are the run model's (``gym_artifacts.run.journal``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

from gym_artifacts.core.atomic import open_regular
from gym_artifacts.live.worker import BackgroundWorker, Call, RecordSink
from gym_artifacts.run.journal import journal_line, last_step, repair_partial_last_line, set_aside
from gym_artifacts.run.metric_records import MetricEntry, MetricRecord

logger = logging.getLogger(__name__)


class MetricsJournal:
    """Appends ``{"step", "time", "metrics"}`` lines to a run's journal off the caller's thread."""

    def __init__(self, fpath: Path, *, resume: bool, max_queued: int = 100_000) -> None:
        self.fpath = fpath
        self._fh: IO[bytes] | None = None
        self._opened = threading.Event()
        self._previous_last_step: int | None = None
        self.worker = BackgroundWorker(
            "journal", max_queued=max_queued, records=RecordSink(self._write, self._write_batch)
        )
        self.worker.submit(Call(self._open, (resume,), "open", counted=False))

    def previous_last_step(self, timeout: float = 10.0) -> int | None:
        """The last step an earlier process of this (resumed) run journaled, or None."""
        self._opened.wait(timeout)
        return self._previous_last_step

    def _open(self, resume: bool) -> None:
        try:
            self.fpath.parent.mkdir(parents=True, exist_ok=True)
            if resume:
                repair_partial_last_line(self.fpath)
                self._previous_last_step = last_step(self.fpath)
            else:
                set_aside(self.fpath)
            self._fh = open_regular(self.fpath, "ab", buffering=0)  # kept open for the run, closed in _close
        finally:
            self._opened.set()

    def start_over(self) -> None:
        """A resume found nothing to resume: the journal starts anew (the old one set aside)."""
        self.worker.submit(Call(self._reopen_fresh, (), "start_over", counted=False))

    def _reopen_fresh(self) -> None:
        self._close()
        self._open(resume=False)

    def append_record(self, record: MetricRecord) -> None:
        """Enqueue one line, encoded once by the fan-out (see ``metric_records``); never blocks."""
        self.worker.submit_record(record)

    def _write(self, metrics: dict[str, Any], step: int | None, when: float) -> None:
        if self._fh is None:
            raise RuntimeError(f"journal {self.fpath} is not open")
        self._append(journal_line(metrics, step, when) + b"\n")

    def _write_batch(self, entries: list[MetricEntry]) -> None:
        if self._fh is None:
            raise RuntimeError(f"journal {self.fpath} is not open")
        lines = [journal_line(m, step, when) for m, step, when in entries]
        self._append(b"\n".join(lines) + b"\n")

    def _append(self, data: bytes) -> None:
        """Append whole lines or nothing, straight to the OS (a kill loses none written).

        A write that fails part-way (the disk filled) is cut back to where it started, so every
        call is either journaled whole or counted lost: never half a line, never counted twice
        when its batch is retried call by call.
        """
        assert self._fh is not None
        fd = self._fh.fileno()
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise

    def flush(self, timeout: float) -> bool:
        return self.worker.flush(timeout)

    def close(self, timeout: float) -> bool:
        """Write what is queued (within ``timeout``), flush to disk and stop."""
        self.worker.submit(Call(self._close, (), "close", counted=False))
        return self.worker.stop(timeout)

    def _close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
