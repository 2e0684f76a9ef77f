"""ChunkRangeProfiler: the torch profiler around a range of chunks, always closed.

``EXPERIMENT_PROFILE_RANGE="start,stop"`` (inclusive) picks the chunks; an invalid range is
warned about and ignored. Activities are what this torch supports (CPU-only works). The
profiler is exited when the range ends, when a chunk body raises, or at ``close()``, so it is
never left open. The trace (gzip chrome trace) and a summary table are published atomically.
Only rank 0 profiles.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import shutil
import tempfile
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

    @property
    def active(self) -> bool:
        return self.range is not None and not self._done

    @property
    def running(self) -> bool:
        """Whether the torch profiler is open right now."""
        return self._profiler is not None

    @contextlib.contextmanager
    def chunk(self, index: int) -> Iterator[None]:
        if not self.active or self.range is None or not (self.range[0] <= index <= self.range[1]):
            yield
            return
        marker = self._start(index)
        if marker is None:  # the profiler could not start: the chunk runs unprofiled
            yield
            return
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
        atomic_write_bytes(self.artifacts_dpath / SUMMARY_NAME, table.encode())


def _has_cuda(profiler: Any) -> bool:
    import torch

    return any(a == torch.profiler.ProfilerActivity.CUDA for a in getattr(profiler, "activities", ()))
