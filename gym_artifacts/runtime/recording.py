"""Recording assembly: ``init.mp4`` + ``chunk_<n>.m4s`` into one fragmented MP4, zero-copy.

Chunks are ordered by their integer index (``chunk_100000`` after ``chunk_99999``); the gaps
between them are reported as ranges, so memory follows the chunks present, never the values of
their indexes (``chunk_1733212800`` beside ``chunk_0..2`` is one gap, not 1.7 billion entries).
The bytes move in the kernel (``os.copy_file_range``, else ``os.sendfile``, else a buffered copy;
the kernel loop is ``snapshot``'s), never through a whole-file buffer. The result is published
atomically.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gym_artifacts.core.atomic import atomic_writer
from gym_artifacts.core.errors import RunError
from gym_artifacts.core.snapshot import kernel_copy_loop

CHUNK_RE = re.compile(r"^chunk[_-](\d+)\.m4s$")


@dataclass
class RecordingReport:
    """What went into an assembled recording."""

    chunks: int
    first_index: int | None
    last_index: int | None
    missing_ranges: list[tuple[int, int]] = field(default_factory=list)  # inclusive (first, last)
    bytes: int = 0
    method: str = ""

    @property
    def missing_count(self) -> int:
        """How many indexes the gaps hold (a number, however large)."""
        return sum(last - first + 1 for first, last in self.missing_ranges)


def missing_ranges(indexes: list[int]) -> list[tuple[int, int]]:
    """The gaps between sorted distinct ``indexes``, each as an inclusive ``(first, last)``."""
    return [(a + 1, b - 1) for a, b in itertools.pairwise(indexes) if b - a > 1]


def chunk_files(session_dir: Path) -> list[tuple[int, Path]]:
    """``(index, path)`` of every chunk, in integer index order."""
    found = []
    for entry in os.scandir(session_dir):
        match = CHUNK_RE.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def _copy_fd(src_fd: int, dst_fd: int, size: int, method: list[str]) -> int:
    """Copy ``size`` bytes at the current offsets, in the kernel when the system allows.

    ``method`` holds the way that works here; it falls back (and remembers) when the kernel or
    the filesystem refuses one (``core.snapshot.kernel_copy_loop`` decides what counts as refused).
    """
    start = os.lseek(src_fd, 0, os.SEEK_CUR)
    kernel_steps: dict[str, Callable[[int, int], int]] = {
        "copy_file_range": lambda _, count: os.copy_file_range(src_fd, dst_fd, count),
        "sendfile": lambda offset, count: os.sendfile(dst_fd, src_fd, start + offset, count),
    }
    for name, fallback in (("copy_file_range", "sendfile"), ("sendfile", "buffered")):
        if method[0] != name:
            continue
        copied = kernel_copy_loop(kernel_steps[name], size)
        if copied is not None:
            return copied
        method[0] = fallback
    return _buffered_copy(src_fd, dst_fd, size)


def _buffered_copy(src_fd: int, dst_fd: int, size: int) -> int:
    copied = 0
    while copied < size:
        block = os.read(src_fd, min(1 << 20, size - copied))
        if not block:
            break
        view = memoryview(block)
        while view:
            written = os.write(dst_fd, view)
            view = view[written:]
        copied += len(block)
    return copied


def assemble_recording(session_dir: Path | str, dest: Path | str, *, durable: bool = True) -> RecordingReport:
    """Concatenate the session's init segment and chunks into ``dest`` (atomically).

    ``durable`` (the default) fsyncs before publishing, so the file also survives a power loss.
    """
    session_dir, dest = Path(session_dir), Path(dest)
    init = session_dir / "init.mp4"
    if not init.is_file():
        raise RunError(f"{session_dir}: no init.mp4, cannot assemble a recording")
    chunks = chunk_files(session_dir)
    indexes = [i for i, _ in chunks]
    method = [_initial_method()]
    total = 0
    with atomic_writer(dest, durable=durable) as out:
        out.flush()
        dst_fd = out.fileno()
        for fpath in [init, *(p for _, p in chunks)]:
            with open(fpath, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                copied = _copy_fd(src.fileno(), dst_fd, size, method)
                if copied != size:
                    raise RunError(f"{fpath}: copied {copied} of {size} bytes (file changed while copying?)")
                total += copied
                os.lseek(dst_fd, 0, os.SEEK_END)
    return RecordingReport(
        chunks=len(chunks),
        first_index=indexes[0] if indexes else None,
        last_index=indexes[-1] if indexes else None,
        missing_ranges=missing_ranges(indexes),
        bytes=total,
        method=method[0],
    )


def _initial_method() -> str:
    if hasattr(os, "copy_file_range"):
        return "copy_file_range"
    return "sendfile" if hasattr(os, "sendfile") else "buffered"
