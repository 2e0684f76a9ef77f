"""Recording assembly: ``init.mp4`` + ``chunk_<n>.m4s`` into one fragmented MP4, zero-copy.

Chunks are ordered by their integer index (``chunk_100000`` after ``chunk_99999``), missing
indexes are reported, and the bytes move in the kernel (``os.copy_file_range``, else
``os.sendfile``, else a buffered copy; the kernel loop is ``snapshot``'s), never through a
whole-file buffer. The result is published atomically.
"""

from __future__ import annotations

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
    missing_indexes: list[int] = field(default_factory=list)
    bytes: int = 0
    method: str = ""


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
    missing = sorted(set(range(indexes[0], indexes[-1] + 1)) - set(indexes)) if indexes else []
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
        missing_indexes=missing,
        bytes=total,
        method=method[0],
    )


def _initial_method() -> str:
    if hasattr(os, "copy_file_range"):
        return "copy_file_range"
    return "sendfile" if hasattr(os, "sendfile") else "buffered"
