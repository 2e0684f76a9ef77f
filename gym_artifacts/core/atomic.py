"""Atomic publication of files: a reader sees the old file, the new file, or none, never a part.

Every file gym-artifacts produces goes through here: written to a hidden temporary file in the
same folder, flushed and fsynced, then renamed over the final name with ``os.replace`` (which
replaces a link planted under the final name, never what it points to). Files kept open and
appended to (the journal, a series, a live backend's files) are opened with :func:`open_regular`,
which never follows a link nor opens a FIFO, device or folder.

Inside ``sync_barrier()`` the waits are batched: each file is renamed into place without its own
fsync, and the barrier's exit fsyncs every file published in it, then each of their folders once.
Kill safety is unchanged (a reader still sees the old file or the whole new one: the page cache
survives a killed process); against a power loss, nothing published inside a barrier is durable
until the barrier returns, so whatever claims completion (a run's status, a receipt) is written
after it.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

TEMP_PREFIX = ".gymart-tmp-"


class SyncBarrier:
    """Files published without their own fsync, made durable together by ``sync()``."""

    def __init__(self) -> None:
        self.files: dict[Path, None] = {}

    def add(self, fpath: Path) -> None:
        self.files[fpath] = None

    def sync(self) -> None:
        """Start the write-back of every file at once, then fsync each (their waits overlap) and
        each folder once: one wait for the batch instead of one per file and folder."""
        fpaths = list(self.files)
        self.files.clear()
        for start in range(0, len(fpaths), _SYNC_BATCH):
            fds = [fd for fd in map(_open_for_sync, fpaths[start : start + _SYNC_BATCH]) if fd is not None]
            try:
                for fd in fds:
                    _start_writeback(fd)
                for fd in fds:
                    os.fsync(fd)
            finally:
                for fd in fds:
                    os.close(fd)
        for dpath in dict.fromkeys(fpath.parent for fpath in fpaths):
            _fsync_dir(dpath)


_BARRIER: contextvars.ContextVar[SyncBarrier | None] = contextvars.ContextVar("gymart_barrier", default=None)


@contextlib.contextmanager
def sync_barrier() -> Iterator[SyncBarrier]:
    """Batch the durability waits of the atomic writes in this block (this thread's).

    On a normal exit every file published in the block is fsynced, then its folder; on an
    exception nothing is waited for (the caller claims nothing). Nested blocks join the outer one.
    """
    outer = _BARRIER.get()
    if outer is not None:
        yield outer
        return
    barrier = SyncBarrier()
    token = _BARRIER.set(barrier)
    try:
        yield barrier
    finally:
        _BARRIER.reset(token)
    barrier.sync()


_OPEN_MODES = {
    "ab": os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    "wb": os.O_WRONLY | os.O_CREAT,
    "rb+": os.O_RDWR,
}


def open_regular(fpath: Path | str, mode: str = "ab", buffering: int = -1) -> IO[bytes]:
    """``open(fpath, mode)`` for ``ab``, ``wb`` (truncates) or ``rb+``, refusing a link
    (``O_NOFOLLOW``) and anything but a regular file (checked on the open file, before any
    byte is truncated or written): a link planted in a run must not redirect a write elsewhere,
    a FIFO must not block the writer."""
    flags = _OPEN_MODES[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(fpath, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR) or os.path.islink(fpath):
            raise OSError(exc.errno, f"{fpath} is not a regular file (a link or special file)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{fpath} is not a regular file")
        os.set_blocking(fd, True)
        if mode == "wb":
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode, buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def _fsync_dir(dpath: Path) -> None:
    """Persist a rename: without it a crash can forget the new directory entry."""
    try:
        fd = os.open(dpath, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_SYNC_BATCH = 256  # files open at once in a barrier's sync
_SYNC_FILE_RANGE_WRITE = 2


def _open_for_sync(fpath: Path) -> int | None:
    try:
        return os.open(fpath, os.O_RDONLY)
    except FileNotFoundError:
        return None  # replaced since: its successor was published (and added) after it


@functools.cache
def _sync_file_range() -> Any:
    """Linux's ``sync_file_range`` (not in ``os``), or None where the C library lacks it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the file's dirty pages back, without waiting: the fsync
    that follows then waits for a write already in flight. Best effort (a hint)."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


@contextlib.contextmanager
def atomic_writer(fpath: Path | str, mode: str = "wb", *, durable: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``fpath``; publish it under ``fpath`` only if the block succeeds.

    ``durable`` fsyncs the data before the rename (survives a power loss, not only a kill); inside
    ``sync_barrier()`` that wait is left to the barrier.
    """
    fpath = Path(fpath)
    barrier = _BARRIER.get() if durable else None
    fpath.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix="-" + fpath.name[:60], dir=fpath.parent)
    tmp_fpath = Path(tmp_name)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            if barrier is not None:
                _start_writeback(fh.fileno())  # under way while the next files are written
            elif durable:
                os.fsync(fh.fileno())
        os.chmod(tmp_fpath, 0o644)
        os.replace(tmp_fpath, fpath)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_fpath.unlink()
        raise
    if barrier is not None:
        barrier.add(fpath)
    else:
        _fsync_dir(fpath.parent)


def atomic_write_bytes(fpath: Path | str, data: bytes) -> None:
    """Publish ``data`` as ``fpath`` atomically."""
    with atomic_writer(fpath) as fh:
        fh.write(data)


def atomic_write_json(fpath: Path | str, obj: Any) -> None:
    """Publish ``obj`` as indented, key-sorted JSON atomically."""
    atomic_write_bytes(fpath, dumps_pretty(obj))


_PRETTY = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def dumps_pretty(obj: Any) -> bytes:
    """JSON for people and diffs: indented, keys sorted, a final newline.

    Integers past 64 bits (which orjson refuses) are written exactly, by the standard library,
    and so is a lone surrogate (a path's undecodable byte, ``os.fsdecode``'s ``\\udce9``): as its
    JSON escape, so the file stays UTF-8 and reads back as the same string.
    """
    try:
        return orjson.dumps(obj, option=_PRETTY)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        return text.encode("utf-8", "backslashreplace") + b"\n"
