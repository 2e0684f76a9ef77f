"""An export's overall deadline, enforced by the export itself whatever its server does.

An HTTP client's timeouts bound each read, not a request: a server that drips a byte every few
seconds keeps every read timeout from firing, forever. ``run_watched`` runs a backend's send on
a thread of its own and waits at most the deadline, counted from the start and again from each
unit of progress the send reports (``made_progress``: a batch of traces the server took), so a
large export that keeps landing batches is never cut off while one whose server stops answering
ends a deadline after its last batch. When it passes, the send is *abandoned*:
every socket the send's threads connected is shut down (which wakes a blocked read at once),
any further connection they attempt is refused, and the caller gets ``DeadlinePassed``, one
line, reported as the backend's FAILED result. The abandoned thread ends on the error its
closed socket gives; it can send nothing more.

Sockets are attributed to a send by thread: the thread ``run_watched`` starts, and any thread
a backend starts for it that calls ``adopt`` (MLflow runs each request on one); and by address:
any thread's connection to the backend's server while the send runs (an SDK's own background
threads, such as W&B's telemetry, which would otherwise keep the interpreter's exit waiting on
a dripping server). Attribution uses Python's ``socket.connect`` audit event (one process-wide
hook, installed on first use, that returns at once for every other event when nothing is
watched).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from gym_artifacts.core.errors import GymArtifactsError

T = TypeVar("T")
ABANDON_GRACE_S = 2.0  # after abandoning, how long to wait for the send's thread to end
# The longest the main thread waits without running Python code: a Ctrl-C the kernel handed to
# another thread (any that does not block SIGINT) is raised in the main thread only then.
SIGNAL_CHECK_S = 0.2


class DeadlinePassed(GymArtifactsError):
    """A backend's export ran past its deadline and was abandoned (its requests cut off)."""


class Watch:
    """One watched send: its threads, the sockets they connected, and whether it was abandoned."""

    def __init__(self, seconds: float, what: str, addresses: frozenset[tuple[str, int]] = frozenset()):
        self.seconds = seconds
        self.what = what
        self.addresses = addresses
        self.abandoned = False
        self.last_progress = time.monotonic()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()

    def adopt(self) -> None:
        """Attribute the calling thread's connections to this send (call it on the new thread)."""
        _WATCHED[threading.get_ident()] = self

    def release(self) -> None:
        """The calling thread no longer works for this send."""
        if _WATCHED.get(threading.get_ident()) is self:
            del _WATCHED[threading.get_ident()]

    def progress(self) -> None:
        """The send took a step (the server answered a unit of work): the deadline restarts."""
        self.last_progress = time.monotonic()

    def left(self) -> float:
        """Seconds until the deadline, counted from the last progress (<= 0: passed)."""
        return self.last_progress + self.seconds - time.monotonic()

    def connecting(self, sock: socket.socket) -> None:
        with self._lock:
            if self.abandoned:
                raise ConnectionAbortedError(f"{self.what} was abandoned at its deadline")
            self._sockets.add(sock)

    def abandon(self) -> int:
        """Refuse new connections and shut every connected socket down; returns how many."""
        with self._lock:
            self.abandoned = True
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
            with contextlib.suppress(OSError):
                sock.close()
        return len(sockets)

    def failure(self) -> DeadlinePassed:
        return DeadlinePassed(
            f"export deadline of {self.seconds:g} s passed (the server did not answer in time); "
            "its requests were abandoned"
        )


_WATCHED: dict[int, Watch] = {}  # thread ident -> the send it works for
_BY_ADDRESS: list[Watch] = []  # sends whose server's connections from any thread are theirs
_HOOK_LOCK = threading.Lock()
_hook_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or not (_WATCHED or _BY_ADDRESS):
        return
    if len(args) < 2 or not isinstance(args[0], socket.socket):
        return
    watch = _WATCHED.get(threading.get_ident())
    if watch is not None:
        watch.connecting(args[0])
        return
    address = args[1]
    if isinstance(address, tuple) and len(address) >= 2:
        for watch in list(_BY_ADDRESS):
            if (address[0], address[1]) in watch.addresses and not watch.abandoned:
                watch.connecting(args[0])
                return


def server_addresses(url: str | None) -> frozenset[tuple[str, int]]:
    """The (ip, port) pairs an ``http(s)://host:port`` URL connects to (empty when unknown)."""
    from urllib.parse import urlsplit

    if not url:
        return frozenset()
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return frozenset()
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return frozenset()
    return frozenset((info[4][0], port) for info in infos)


class _QuietOnceAbandoned(logging.Filter):
    """Drops what a thread of an abandoned send logs: the export's result is out, and the
    send's last gasps (urllib3's "Retrying ... after connection broken by ..." for each retry its
    refused connections cost) would read as if it were still going on."""

    def filter(self, record: logging.LogRecord) -> bool:
        watch = _WATCHED.get(threading.get_ident())
        return watch is None or not watch.abandoned


# The loggers an abandoned send's HTTP client speaks through (a filter applies to the records
# of its own logger only, not to its children's).
QUIETED_LOGGERS = ("urllib3.connectionpool", "urllib3.util.retry", "urllib3.connection", "httpx", "httpcore")


def _install_hook() -> None:
    global _hook_installed
    with _HOOK_LOCK:
        if not _hook_installed:
            sys.addaudithook(_audit)  # permanent by design of audit hooks; a no-op when unwatched
            quiet = _QuietOnceAbandoned()
            for name in QUIETED_LOGGERS:
                logging.getLogger(name).addFilter(quiet)
            _hook_installed = True


def current_watch() -> Watch | None:
    """The watch of the calling thread's send (a backend passes it to threads it starts)."""
    return _WATCHED.get(threading.get_ident())


def made_progress() -> None:
    """Report a unit of progress of the calling thread's send (its deadline restarts); a no-op
    on a thread that works for no watched send."""
    watch = current_watch()
    if watch is not None:
        watch.progress()


def adopted(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` for another thread, its connections attributed to the caller's send (if watched)."""
    watch = current_watch()
    if watch is None:
        return fn

    def run() -> T:
        watch.adopt()
        try:
            return fn()
        finally:
            watch.release()

    return run


def run_watched(
    fn: Callable[[], T],
    seconds: float,
    what: str,
    on_abandon: Callable[[], None] | None = None,
    server: str | None = None,
) -> T:
    """``fn()``, or DeadlinePassed once ``seconds`` pass without progress while it still runs
    (counted from the start and from each ``made_progress`` of its threads; then abandoned: its
    sockets shut down, then ``on_abandon()`` for what sockets of this process cannot stop, such
    as a helper process sending on its behalf). ``server``: the backend's URL, whose connections
    from any thread belong to the send while it runs."""
    _install_hook()
    watch = Watch(seconds, what, server_addresses(server))
    outcome: dict[str, Any] = {}

    def target() -> None:
        watch.adopt()
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc
        finally:
            watch.release()

    thread = threading.Thread(target=target, name=f"gym-artifacts-{what}", daemon=True)
    if watch.addresses:
        _BY_ADDRESS.append(watch)
    try:
        thread.start()
        while thread.is_alive() and watch.left() > 0:
            thread.join(min(watch.left(), SIGNAL_CHECK_S))
        if thread.is_alive():
            watch.abandon()
            if on_abandon is not None:
                on_abandon()
            thread.join(ABANDON_GRACE_S)  # usually ends at once on its closed socket
            raise watch.failure()
    finally:
        if watch in _BY_ADDRESS:
            _BY_ADDRESS.remove(watch)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
