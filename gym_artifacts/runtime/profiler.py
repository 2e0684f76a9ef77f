"""ChunkRangeProfiler: the torch profiler around a range of chunks, always closed.

``EXPERIMENT_PROFILE_RANGE="start,stop"`` (inclusive) picks the chunks; an invalid range is
warned about and ignored. Activities are what this torch supports (CPU-only works). The
profiler is exited when the range ends, when a chunk body raises, at ``close()``, at the
session's ``finalize`` (a range past the last chunk: ``"2,4"`` with 3 chunks) or at process exit,
so it is never left open. The trace (gzip chrome trace) and a summary table are published
atomically; the session's manifest says which chunks of the range were profiled and which never
ran, or why there is no trace (:func:`finish_profilers`). Only rank 0 profiles.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym_artifacts.core.atomic import atomic_write_bytes, atomic_writer
from gym_artifacts.core.ranks import is_rank_zero
from gym_artifacts.run.layout import PROFILER_TRACE

logger = logging.getLogger(__name__)

TRACE_NAME = PROFILER_TRACE
SUMMARY_NAME = "profile.summary.txt"


def parse_range(spec: str | None) -> tuple[int, int] | None:
    """``"start,stop"`` as an inclusive range, or None (with a warning) when it is invalid."""
    if spec is None or not spec.strip():
        return None
    parts = [p.strip() for p in spec.split(",")]
    try:
        start, stop = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (None, None)
    except ValueError:
        start = stop = None
    if start is None or stop is None or start < 0 or stop < start:
        logger.warning(
            "EXPERIMENT_PROFILE_RANGE=%r is not 'start,stop' with 0 <= start <= stop; not profiling", spec
        )
        return None
    return start, stop


class ChunkRangeProfiler:
    """Wrap each chunk in ``with profiler.chunk(i):``; chunks in the range are profiled."""

    def __init__(
        self, artifacts_dpath: Path | str, profile_range: str | None = None, *, row_limit: int = 40
    ) -> None:
        self.artifacts_dpath = Path(artifacts_dpath)
        spec = profile_range if profile_range is not None else os.environ.get("EXPERIMENT_PROFILE_RANGE")
        self.range = parse_range(spec) if is_rank_zero() else None
        self.row_limit = row_limit
        self._profiler: Any = None
        self._done = False
        self.error: str | None = None
        self.profiled: tuple[int, int] | None = None  # the first and last chunk profiled
        self.last_chunk: int | None = None  # the last chunk run, in the range or not
        if self.range is not None:
            _register(self)

    @property
    def active(self) -> bool:
        return self.range is not None and not self._done

    @property
    def running(self) -> bool:
        """Whether the torch profiler is open right now."""
        return self._profiler is not None

    @contextlib.contextmanager
    def chunk(self, index: int) -> Iterator[None]:
        self.last_chunk = index
        if not self.active or self.range is None or not (self.range[0] <= index <= self.range[1]):
            yield
            return
        marker = self._start(index)
        if marker is None:  # the profiler could not start: the chunk runs unprofiled
            yield
            return
        self.profiled = (self.profiled[0] if self.profiled else index, index)
        try:
            with marker:
                yield
        except BaseException:
            self.close(partial_at=index)
            raise
        if index == self.range[1]:
            self.close()

    def _start(self, index: int) -> Any:
        """Open the profiler (once) and return the chunk's marker; on any failure (no torch, a
        profiler already running elsewhere) warn once, give up profiling, and return None."""
        try:
            import torch

            if self._profiler is None:
                profiler = torch.profiler.profile(activities=list(torch.profiler.supported_activities()))
                profiler.__enter__()
                self._profiler = profiler
            return torch.profiler.record_function(f"chunk_{index}")
        except Exception as exc:
            self.error = f"profiling disabled: {type(exc).__name__}: {exc}"
            logger.warning("EXPERIMENT_PROFILE_RANGE is set but %s", self.error)
            self._done = True
            with contextlib.suppress(Exception):
                if self._profiler is not None:
                    self._profiler.__exit__(None, None, None)
            self._profiler = None
            return None

    def close(self, partial_at: int | None = None) -> None:
        """Exit the profiler if it is open and publish what it recorded; safe to call again."""
        profiler, self._profiler = self._profiler, None
        self._done = True
        if profiler is None:
            return
        try:
            profiler.__exit__(None, None, None)
        except Exception as exc:
            self.error = f"profiler exit failed: {exc}"
            logger.warning("%s", self.error)
            return
        try:
            self._write(profiler, partial_at)
        except Exception as exc:
            self.error = f"profile not written: {type(exc).__name__}: {exc}"
            logger.warning("%s", self.error)

    def _write(self, profiler: Any, partial_at: int | None) -> None:
        self.artifacts_dpath.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".gymart-prof-", dir=self.artifacts_dpath) as tmp:
            raw = Path(tmp) / "trace.json"
            profiler.export_chrome_trace(str(raw))
            with (
                atomic_writer(self.artifacts_dpath / TRACE_NAME) as out,
                open(raw, "rb") as src,
                gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz,
            ):
                shutil.copyfileobj(src, gz, 1 << 20)
        sort_by = "self_cuda_time_total" if _has_cuda(profiler) else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)
        if partial_at is not None and self.range is not None:
            first, last = self.range
            table = f"partial profile: chunk {partial_at} raised inside range {first},{last}\n{table}"
        elif self.never_ran():
            table = f"partial profile: {self._never_ran_text()}\n{table}"
        atomic_write_bytes(self.artifacts_dpath / SUMMARY_NAME, table.encode())


    def never_ran(self) -> list[list[int]]:
        """The chunks of the range after the last one profiled, as ``[[first, last]]`` (none when
        the range was profiled to its end)."""
        if self.range is None or self.profiled is None or self.profiled[1] >= self.range[1]:
            return []
        return [[self.profiled[1] + 1, self.range[1]]]

    def _never_ran_text(self) -> str:
        assert self.range is not None
        first, last = self.never_ran()[0]
        return f"range {self.range[0]},{self.range[1]}: chunks {first}..{last} never ran (closed before them)"

    def outcome(self) -> tuple[dict[str, Any] | None, str | None]:
        """What the manifest says of this profiler: (a note on what the trace covers, or None;
        why there is no trace, or None)."""
        if self.range is None:
            return None, None
        spec = f"EXPERIMENT_PROFILE_RANGE={self.range[0]},{self.range[1]}"
        if self.profiled is None:
            ran = "no chunk ran" if self.last_chunk is None else f"the last chunk run was {self.last_chunk}"
            return None, self.error or f"{spec}: no chunk in the range ran ({ran}); nothing was profiled"
        note = {"range": list(self.range), "profiled": list(self.profiled), "never_ran": self.never_ran()}
        return note, (f"{spec}: {self.error}" if self.error else None)


# Profilers with a range, until their session's ``finalize`` or process exit closes them.
_profilers: weakref.WeakSet[ChunkRangeProfiler] = weakref.WeakSet()
_profilers_lock = threading.Lock()


def _register(profiler: ChunkRangeProfiler) -> None:
    with _profilers_lock:
        if not _profilers:
            atexit.register(_close_all)
        _profilers.add(profiler)


def _close_all() -> None:
    """At process exit: no profiler is left open, whatever its range."""
    with _profilers_lock:
        profilers = list(_profilers)
    for profiler in profilers:
        profiler.close()


def finish_profilers(artifacts_dpath: Path) -> list[tuple[dict[str, Any] | None, str | None]]:
    """Close every profiler writing into ``artifacts_dpath`` (publishing what it recorded) and
    return each one's :meth:`ChunkRangeProfiler.outcome`; the session's ``finalize`` calls it
    before writing the manifest."""
    with _profilers_lock:
        mine = [p for p in _profilers if _same_dir(p.artifacts_dpath, artifacts_dpath)]
    outcomes = []
    for profiler in mine:
        profiler.close()
        outcomes.append(profiler.outcome())
        with _profilers_lock:
            _profilers.discard(profiler)
    return outcomes


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def _has_cuda(profiler: Any) -> bool:
    import torch

    return any(a == torch.profiler.ProfilerActivity.CUDA for a in getattr(profiler, "activities", ()))
