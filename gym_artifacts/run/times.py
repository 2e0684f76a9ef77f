"""When the eval itself ran, so a backend run shows the eval's times, not the export's.

From the best source the run has: the runtime session's ``session_times.json`` (start and end
as written by the session, reactor-runtime's too); else the first and last times of the live
metrics journal; else the modification times of the run's files (the earliest and latest).
"""

from __future__ import annotations

import datetime as dt
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.jsonio import read_json
from gym_artifacts.run.layout import SESSION_TIMES

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts



@dataclass(frozen=True)
class RunTimes:
    """Start and end in seconds since the epoch, and which source gave them."""

    start: float
    end: float
    source: str  # "session", "journal" or "files"

    @property
    def start_ms(self) -> int:
        return int(self.start * 1000)

    @property
    def end_ms(self) -> int:
        return int(self.end * 1000)

    def iso(self, when: float) -> str:
        return dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat()


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.timezone.utc)
        return parsed.timestamp()
    return None


def _session(run: RunArtifacts) -> RunTimes | None:
    fpath = run.artifacts_dpath / SESSION_TIMES
    if not fpath.is_file():
        return None
    try:
        data = read_json(fpath, "session times JSON")
    except RunError:
        return None
    if not isinstance(data, dict):
        return None
    start, end = _epoch(data.get("start")), _epoch(data.get("end"))
    if start is None:
        return None
    return RunTimes(start, end if end is not None and end >= start else start, "session")


def _journal(run: RunArtifacts) -> RunTimes | None:
    from gym_artifacts.run.journal import iter_journal

    first = last = None
    try:
        for entry in iter_journal(run):
            first = entry.time if first is None else min(first, entry.time)
            last = entry.time if last is None else max(last, entry.time)
    except RunError:
        return None
    if first is None or last is None:
        return None
    return RunTimes(first, last, "journal")


def _files(run: RunArtifacts) -> RunTimes | None:
    try:
        times = [os.stat(p).st_mtime for p in run.artifact_files().values()]
    except (OSError, RunError):
        return None
    if not times:
        return None
    return RunTimes(min(times), max(times), "files")


def run_times(run: RunArtifacts) -> RunTimes | None:
    """The eval's start and end: session times, else the journal's, else the files'."""
    return _session(run) or _journal(run) or _files(run)


def eval_times(run: RunArtifacts) -> dict[str, Any]:
    """The eval's times as record fields (empty when the run has none)."""
    times = run_times(run)
    if times is None:
        return {}
    return {
        "eval_started_at": times.iso(times.start),
        "eval_ended_at": times.iso(times.end),
        "eval_times_from": times.source,
    }
