"""The live metrics journal ``STEM_metrics.jsonl``: every step metric, whatever the backends did.

One complete JSON line per metric call (written by ``gym_artifacts.live.journal_writer``), so a
killed process leaves every written line readable. The post-run export sends it with the
original steps and times. The line format (``journal_line``) and the reader (``iter_journal``)
live here only; the local backend writes its copy with ``journal_line`` too.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.atomic import open_regular
from gym_artifacts.core.errors import RunError
from gym_artifacts.core.jsonio import canonical_json, iter_jsonl
from gym_artifacts.core.secrets import mask_secret_named
from gym_artifacts.run.torn import partial_last_line

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts


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
