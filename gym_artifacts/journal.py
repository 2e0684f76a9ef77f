"""The live metrics journal ``STEM_metrics.jsonl``: every step metric, whatever the backends did.

Written on its own background worker (the caller only enqueues), one complete JSON line per
metric call, flushed after every batch, so a killed process leaves every written line readable.
The post-run export sends it with the original steps and times. The line format
(``journal_line``), the writer (``MetricsJournal``) and the reader (``iter_journal``) live here
only; the local backend writes its copy with ``journal_line`` too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gym_artifacts.atomic import open_regular
from gym_artifacts.errors import RunError
from gym_artifacts.jsonio import canonical_json, iter_jsonl
from gym_artifacts.metric_records import MetricEntry, MetricRecord
from gym_artifacts.secrets import mask_secret_named
from gym_artifacts.torn import partial_last_line
from gym_artifacts.worker import BackgroundWorker, Call, RecordSink

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from gym_artifacts.run import RunArtifacts


def journal_line(metrics: dict[str, Any], step: int | None, when: float) -> bytes:
    """One journal line, without its newline: ``{"metrics": ..., "step": ..., "time": ...}``."""
    return canonical_json({"step": step, "time": when, "metrics": metrics})


@dataclass(frozen=True)
class JournalEntry:
    """One live ``export_metrics`` call as the journal recorded it."""

    step: int | None
    time: float
    metrics: dict[str, Any]


def iter_journal(run: RunArtifacts) -> Iterator[JournalEntry]:
    """The live metrics journal's entries, in order; a malformed line names file and line.

    A torn last line (its writer was interrupted) is left out, with a warning naming the file.
    """
    fpath = run.metrics_journal_fpath
    if not run.has_rollouts_file or not fpath.is_file():
        return
    torn = partial_last_line(fpath)  # a writer interrupted mid-line (killed, disk full)
    if torn is not None:
        logger.warning("%s; that line is left out", torn.describe(fpath))
    for lineno, record in iter_jsonl(fpath, "metrics journal", end=torn.complete_bytes if torn else None):
        if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
            raise RunError(f"{fpath}:{lineno}: journal line must be an object with 'metrics'")
        step = record.get("step")
        when = record.get("time")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise RunError(f"{fpath}:{lineno}: journal 'step' must be an integer")
        if not isinstance(when, numbers.Real) or isinstance(when, bool) or not math.isfinite(when):
            raise RunError(f"{fpath}:{lineno}: journal 'time' must be a number of seconds")
        yield JournalEntry(step, float(when), mask_secret_named(record["metrics"]))


def repair_partial_last_line(fpath: Path) -> None:
    """Cut a final line a killed writer left unfinished, so appends start on a fresh line."""
    try:
        with open_regular(fpath, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            pos = size
            while pos > 0:
                step = min(65536, pos)
                fh.seek(pos - step)
                block = fh.read(step)
                idx = block.rfind(b"\n")
                if idx >= 0:
                    fh.truncate(pos - step + idx + 1)
                    return
                pos -= step
            fh.truncate(0)
    except FileNotFoundError:
        return


def set_aside(fpath: Path) -> Path | None:
    """Move an earlier run's file out of the way (never deleted); returns where it went."""
    if not fpath.exists():
        return None
    target = fpath.with_name(f"{fpath.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    os.replace(fpath, target)
    return target


def last_step(fpath: Path) -> int | None:
    """The step of the journal's last complete line, read from the file's tail."""
    try:
        with open(fpath, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 65536))
            tail = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for raw in reversed(tail):
        try:
            step = json.loads(raw).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int):
            return step
    return None


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
