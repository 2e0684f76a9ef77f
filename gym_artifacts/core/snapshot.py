"""Snapshot copies: an exported file is an independent copy, published atomically.

No hard links, ever: a hard link shares the run's inode, so a resumed eval appending to
``OUT.jsonl`` (or a byte rewritten in place) would change the export, and editing the export
would change the run. The copy is done in the kernel, fastest first: a reflink (``FICLONE``:
copy-on-write, instant, on Btrfs/XFS/bcachefs), then ``os.copy_file_range`` (server-side or
in-kernel), then ``os.sendfile``, then a plain read/write loop. Every path yields a separate
file whose later changes never reach the other.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gym_artifacts.core.atomic import atomic_writer

FICLONE = 0x40049409  # _IOW(0x94, 9, int): the Linux reflink ioctl
_CHUNK = 1 << 30
# Errors that mean "this method is not available here": fall through to the next one.
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.EPERM,
                errno.EBADF, errno.ETXTBSY}  # fmt: skip


def _reflink(fin: IO[bytes], fout: IO[bytes]) -> bool:
    try:
        fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    return True


def kernel_copy_loop(step: Callable[[int, int], int], size: int) -> int | None:
    """Run ``step(offset, count)`` until ``size`` bytes moved or the source ends: the bytes moved,
    or None when the kernel refuses this method before moving anything (then try the next one).
    The one loop for both kernel methods, here and in recording assembly."""
    copied = 0
    try:
        while copied < size:
            n = step(copied, min(_CHUNK, size - copied))
            if n == 0:
                break
            copied += n
    except OSError as exc:
        if exc.errno in _UNSUPPORTED and copied == 0:
            return None
        raise
    return copied


def _copy_file_range(fin: IO[bytes], fout: IO[bytes], size: int) -> bool:
    if not hasattr(os, "copy_file_range"):
        return False
    def step(_: int, count: int) -> int:
        return os.copy_file_range(fin.fileno(), fout.fileno(), count)

    if kernel_copy_loop(step, size) is None:
        return False
    _copy_rest(fin, fout)
    return True


def _sendfile(fin: IO[bytes], fout: IO[bytes], size: int) -> bool:
    def step(offset: int, count: int) -> int:
        return os.sendfile(fout.fileno(), fin.fileno(), offset, count)

    copied = kernel_copy_loop(step, size)
    if copied is None:
        return False
    fin.seek(copied)
    fout.seek(copied)
    _copy_rest(fin, fout)
    return True


def _copy_rest(fin: IO[bytes], fout: IO[bytes]) -> None:
    """Whatever the source grew by while it was copied (the snapshot ends where reading ends)."""
    while chunk := fin.read(1 << 20):
        fout.write(chunk)


def copy_into(fin: IO[bytes], fout: IO[bytes], method: str | None = None) -> str:
    """Copy an open file's bytes into another, by the first kernel method that works.

    Returns the method used (``reflink``, ``copy_file_range``, ``sendfile`` or ``read``);
    ``method`` forces one (for benchmarks).
    """
    size = os.fstat(fin.fileno()).st_size
    fout.flush()
    methods: list[tuple[str, Any]] = [
        ("reflink", lambda: _reflink(fin, fout)),
        ("copy_file_range", lambda: _copy_file_range(fin, fout, size)),
        ("sendfile", lambda: _sendfile(fin, fout, size)),
    ]
    for name, attempt in methods:
        if method in (None, name) and attempt():
            if name == "reflink":  # the clone ends at the size it saw; position both after it
                fin.seek(0, os.SEEK_END)
                fout.seek(0, os.SEEK_END)
            return name
    _copy_rest(fin, fout)
    return "read"


def snapshot_copy(src: Path | str, dst: Path | str, method: str | None = None) -> int:
    """Publish an independent copy of ``src`` as ``dst`` atomically; returns its size.

    ``dst`` never shares an inode with ``src``; a reader sees the old ``dst`` or the whole new
    one. A ``dst`` that is a hard link of ``src`` (an export by an older release) is replaced
    by a copy; only the very same path is left as it is.
    """
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        return src.stat().st_size
    with open(src, "rb") as fin, atomic_writer(dst) as fout:
        copy_into(fin, fout, method)
        fout.flush()
        return os.fstat(fout.fileno()).st_size
