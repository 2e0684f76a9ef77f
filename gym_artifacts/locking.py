"""An inter-process lock per run and exporter that a dead holder never keeps.

``flock`` locks belong to the open file: the kernel drops them when the holder exits or is
killed, so there is no stale lock to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


class LockBusy(Exception):
    """Another live process holds the lock."""


@contextlib.contextmanager
def exclusive_lock(fpath: Path, wait_seconds: float = 0.0, poll: float = 0.05) -> Iterator[None]:
    """Hold ``fpath``'s lock for the block; wait up to ``wait_seconds``, then raise LockBusy."""
    fd = os.open(fpath, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusy(str(fpath)) from None
                time.sleep(poll)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class HeldLock:
    """A lock taken by ``try_lock``: held until ``release()`` (or the process ends)."""

    def __init__(self, fd: int, fpath: Path) -> None:
        self.fd: int | None = fd
        self.fpath = fpath

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def try_lock(fpath: Path) -> tuple[HeldLock | None, str]:
    """Take ``fpath``'s lock now, or say who holds it: ``(lock, "")`` or ``(None, "pid N")``.

    The holder's pid is written into the file; a dead holder's lock is gone with it.
    """
    fpath.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(fpath, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        return None, f"pid {holder}" if holder else "another process"
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return HeldLock(fd, fpath), ""
