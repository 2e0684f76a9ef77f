"""Atomic publication of files: a reader sees the old file, the new file, or none, never a part.

Every file gym-artifacts produces goes through here: written to a hidden temporary file in the
same folder, flushed and fsynced, then renamed over the final name with ``os.replace`` (which
replaces a link planted under the final name, never what it points to). Files kept open and
appended to (the journal, a series, a live backend's files) are opened with :func:`open_regular`,
which never follows a link nor opens a FIFO, device or folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

TEMP_PREFIX = ".gymart-tmp-"


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


@contextlib.contextmanager
def atomic_writer(fpath: Path | str, mode: str = "wb", *, durable: bool = True) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``fpath``; publish it under ``fpath`` only if the block succeeds.

    ``durable`` fsyncs the data before the rename (survives a power loss, not only a kill).
    """
    fpath = Path(fpath)
    fpath.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix="-" + fpath.name[:60], dir=fpath.parent)
    tmp_fpath = Path(tmp_name)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp_fpath, 0o644)
        os.replace(tmp_fpath, fpath)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_fpath.unlink()
        raise
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

    Integers past 64 bits (which orjson refuses) are written exactly, by the standard library.
    """
    try:
        return orjson.dumps(obj, option=_PRETTY)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str)
        return text.encode("utf-8") + b"\n"
