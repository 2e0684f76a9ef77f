"""When the eval itself ran, so a backend run shows the eval's times, not the export's.

From the best source the run has: the runtime session's ``session_times.json`` (start and end
as written by the session, reactor-runtime's too); else the first and last times of the live
metrics journal; else the rollouts' own times (the earliest start and latest end of
``gym_artifacts.run.trajectory.rollout_window`` over ``OUT.jsonl``: NeMo Gym's ``ng_trajectory``
call times, else the Responses' ``created_at`` and latency). Never the files' modification
times: a copied or downloaded run would be dated at the copy, and an eval that wrote its files
in one go would last milliseconds. A run none of these dates has no times (``None``).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import threading
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
    source: str  # "session", "journal" or "rollouts"

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


_ROLLOUT_TIMES: dict[tuple[str, int, int], RunTimes | None] = {}  # by (path, size, mtime_ns)
_ROLLOUT_TIMES_LOCK = threading.Lock()


def _rollouts(run: RunArtifacts) -> RunTimes | None:
    """The earliest start and latest end of the rollouts (streamed; remembered per unchanged
    file, since every backend of an export asks)."""
    from gym_artifacts.core.jsonio import iter_jsonl
    from gym_artifacts.run.trajectory import rollout_window

    fpath = run.rollouts_fpath
    try:
        stat = os.stat(fpath) if fpath is not None else None
    except OSError:
        return None
    if fpath is None or stat is None:
        return None
    key = (str(fpath), stat.st_size, stat.st_mtime_ns)
    with _ROLLOUT_TIMES_LOCK:
        if key in _ROLLOUT_TIMES:
            return _ROLLOUT_TIMES[key]
    from gym_artifacts.run.rollouts_facts import cached_window

    found, window = cached_window(run)  # the export's one read of the rollouts recorded it
    if found:
        return None if window is None else RunTimes(window[0], window[1], "rollouts")
    first = last = None
    try:
        for _, record in iter_jsonl(fpath, "rollouts JSONL"):
            start, end = rollout_window(record)
            if start is not None:
                first = start if first is None else min(first, start)
                last = end if last is None else max(last, end if end is not None else start)
    except (RunError, OSError):
        pass  # a torn or bad line ends the read: the times of the lines before it stand
    times = None if first is None or last is None else RunTimes(first, last, "rollouts")
    with _ROLLOUT_TIMES_LOCK:
        if len(_ROLLOUT_TIMES) > 64:
            _ROLLOUT_TIMES.clear()
        _ROLLOUT_TIMES[key] = times
    return times


def run_times(run: RunArtifacts) -> RunTimes | None:
    """The eval's start and end: session times, else the journal's, else the rollouts'."""
    return _session(run) or _journal(run) or _rollouts(run)


def eval_end_s(run: RunArtifacts) -> float:
    """When the eval ended (``run_times``), else now: the time of values the eval gives once at
    its end (the aggregate's), never a file's modification time."""
    import time

    times = run_times(run)
    return times.end if times is not None else time.time()


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
