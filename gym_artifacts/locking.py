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
