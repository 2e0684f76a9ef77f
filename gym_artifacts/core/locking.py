"""An inter-process lock per run and exporter that a dead holder never keeps and no command leaves.

``flock`` locks belong to the open file: the kernel drops them when the holder exits or is
killed, so there is no stale lock to clean up.

The lock file is removed by its holder before it unlocks, so no ``*.lock`` stays beside a run
after a command. That is safe against a racer: a process that opened the file before it was
removed may then lock the removed file, so every taker checks, once it holds the lock, that the
path still names the very file it locked (same device and inode), and starts over otherwise.
Whoever holds a lock on the file the path names is the only holder.

A lock path is never followed through a link nor opened when it is a FIFO, device or folder
(``O_NOFOLLOW``, ``O_NONBLOCK``, then a type check): a link planted beside a run would otherwise
let the pid written into the lock truncate a file anywhere the user can write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def shared_lock_fpath(*parts: str) -> Path:
    """The lock of something outside any run folder that exports from any folder share (a
    destination's copy of one run identity, a backend object made on first use), named by
    ``parts``: in ``GYM_ARTIFACTS_LOCK_DIR``, else a per-user folder of the temp folder."""
    default = Path(tempfile.gettempdir()) / f"gym-artifacts-locks-{os.getuid()}"
    root = Path(os.environ.get("GYM_ARTIFACTS_LOCK_DIR") or default)
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{blake3.blake3(chr(0).join(parts).encode()).hexdigest()[:32]}.lock"


class LockBusy(Exception):
    """Another live process holds the lock."""


class UnsafeLockPath(OSError):
    """The lock path is a link or not a regular file: it is reported, never followed or removed."""


def _open_lock_file(fpath: Path) -> int:
    """Open (creating) ``fpath`` for locking; UnsafeLockPath when it is a link or special file."""
    try:
        fd = os.open(fpath, _OPEN_FLAGS, 0o644)
    except OSError as exc:
        if os.path.islink(fpath) or os.path.isdir(fpath):
            raise UnsafeLockPath(exc.errno or 0, f"{fpath} is not a regular file (link or folder)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLockPath(0, f"{fpath} is not a regular file")
    return fd


def _still_named(fd: int, fpath: Path) -> bool:
    """Whether ``fpath`` still names the file open as ``fd`` (a releasing holder may have removed it)."""
    try:
        named = os.lstat(fpath)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _take(fpath: Path) -> tuple[int | None, str]:
    """One attempt: ``(fd, "")`` holding the lock on the file ``fpath`` names, or ``(None, holder)``."""
    while True:
        fd = _open_lock_file(fpath)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            return None, f"pid {holder}" if holder else "another process"
        except BaseException:
            os.close(fd)
            raise
        if _still_named(fd, fpath):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd, ""
        os.close(fd)  # locked a file its holder removed on release: take the one named now


def _release(fd: int, fpath: Path) -> None:
    """Remove the lock file (still holding it, so no one else names it), then unlock."""
    try:
        if _still_named(fd, fpath):
            with contextlib.suppress(OSError):
                os.unlink(fpath)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(
    fpath: Path,
    wait_seconds: float = 0.0,
    poll: float = 0.05,
    on_wait: Callable[[float, str], None] | None = None,
) -> Iterator[None]:
    """Hold ``fpath``'s lock for the block; wait up to ``wait_seconds``, then raise LockBusy.
    ``on_wait(seconds waited, holder)`` is called at each poll while another process holds it
    (``holder``: ``pid N``), so that a long wait can be shown.

    Raises UnsafeLockPath (an OSError) when the path is a link or not a regular file.
    """
    started = time.monotonic()
    deadline = started + wait_seconds
    while True:
        fd, holder = _take(fpath)
        if fd is not None:
            break
        if time.monotonic() >= deadline:
            raise LockBusy(str(fpath))
        if on_wait is not None:
            on_wait(time.monotonic() - started, holder)
        time.sleep(poll)
    try:
        yield
    finally:
        _release(fd, fpath)


class HeldLock:
    """A lock taken by ``try_lock``: held until ``release()`` (or the process ends).

    Only the process that took it releases it: a forked child shares the lock's open file with
    its parent, so an unlock there would drop the parent's lock (the child only closes its copy).
    """

    def __init__(self, fd: int, fpath: Path) -> None:
        self.fd: int | None = fd
        self.fpath = fpath
        self.pid = os.getpid()

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            if os.getpid() != self.pid:
                with contextlib.suppress(OSError):
                    os.close(fd)
                return
            _release(fd, self.fpath)


def try_lock(fpath: Path) -> tuple[HeldLock | None, str]:
    """Take ``fpath``'s lock now, or say who holds it: ``(lock, "")`` or ``(None, "pid N")``.

    The holder's pid is written into the file; a dead holder's lock is gone with it. Raises
    UnsafeLockPath (an OSError) when the path is a link or not a regular file.
    """
    fpath.parent.mkdir(parents=True, exist_ok=True)
    fd, holder = _take(fpath)
    if fd is None:
        return None, holder
    return HeldLock(fd, fpath), ""
