"""Live logging from other processes (Ray tasks and actors): a serializable handle to a live run.

``live.handle()`` returns a small picklable :class:`LiveHandle` (an address and a secret) that a
Ray task or actor, on any node, calls like the live run itself: ``export_metrics`` and
``export_rollouts``. A call only appends to a buffer in that process (microseconds); a sender
thread ships the buffer in batches over one TCP connection to the driver, where a receiver hands
each call to the live run, which journals it and fans it out to the one backend run per
exporter. So a thousand workers make one backend run, never one each.

The wire format is length-prefixed JSON (never pickle): a connection first proves it knows the
handle's secret, and a frame can at most log metrics and rollouts. ``flush`` waits until the
driver applied everything sent before it. Metric calls are dropped (and counted) when a worker's
buffer passes its bound while the driver is unreachable; rollouts are never dropped.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gym_artifacts.core.jsonio import canonical_json, loads_lenient

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
SEND_INTERVAL_S = 0.05  # a worker's buffer is shipped at least this often
BATCH_CALLS = 1000  # ... or as soon as this many calls wait
MAX_BUFFERED_METRICS = 100_000  # per worker process, while the driver is unreachable


def _send_frame(sock: socket.socket, obj: Any) -> None:
    body = canonical_json(obj)
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket) -> Any:
    """One frame, or None when the peer closed; ValueError for a frame that is not ours."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes is over the {MAX_FRAME_BYTES} limit")
    body = _recv_exact(sock, size)
    if body is None:
        return None
    return loads_lenient(body)


# -- the driver side ------------------------------------------------------------------------------
class HandleReceiver:
    """Accepts handles' connections and applies their calls to ``metrics_sink``/``rollouts_sink``."""

    def __init__(
        self,
        metrics_sink: Callable[[dict[str, Any], int | None, float], None],
        rollouts_sink: Callable[[list[Any]], None],
        host: str,
    ) -> None:
        self._metrics_sink = metrics_sink
        self._rollouts_sink = rollouts_sink
        self.secret = secrets.token_hex(16)
        self._server = socket.create_server((host, 0))
        self.address = (host, self._server.getsockname()[1])
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._last_seq: dict[str, int] = {}  # per sender: frames already applied
        self.applied = 0  # calls applied from every connection
        self.refused = 0  # connections that did not know the secret or sent garbage
        threading.Thread(target=self._accept, name="gym-artifacts-handles", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            hello = _recv_frame(conn)
            if not isinstance(hello, dict) or not hmac.compare_digest(str(hello.get("secret")), self.secret):
                self.refused += 1
                return
            while True:
                frame = _recv_frame(conn)
                if frame is None:
                    return
                self._apply(frame)
                if "flush" in frame:
                    _send_frame(conn, {"applied": frame["flush"]})
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if not self._closed:
                self.refused += 1
                logger.warning("live handle: connection dropped: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _apply(self, frame: dict[str, Any]) -> None:
        sender, seq = str(frame["id"]), int(frame["seq"])
        with self._lock:
            if self._closed or seq <= self._last_seq.get(sender, 0):
                return  # a frame sent again after a broken connection: applied already
            self._last_seq[sender] = seq
        for metrics, step, when in frame.get("m", ()):
            self._metrics_sink(metrics, step, float(when))
            self.applied += 1
        for rollouts in frame.get("r", ()):
            self._rollouts_sink(rollouts)
            self.applied += 1

    def close(self) -> None:
        """Stop accepting calls (the live run is ending); open connections are cut."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


# -- the worker side ------------------------------------------------------------------------------
@dataclass
class SenderStats:
    """What one worker process's handle did: calls sent, dropped, and the last error."""

    sent: int = 0
    dropped: int = 0
    last_error: str | None = None


class _Sender:
    """One per worker process and live run: the buffer and the thread that ships it.

    Frames carry this sender's id and a sequence number; a frame whose delivery is in doubt is
    sent again unchanged, and the receiver skips a sequence number it already applied, so a
    broken connection never applies a call twice.
    """

    def __init__(self, address: tuple[str, int], secret: str) -> None:
        self.address = address
        self.secret = secret
        self.sender_id = secrets.token_hex(8)
        self.buffer: deque[tuple[Any, ...]] = deque()
        self.wake = threading.Event()
        self.stats = SenderStats()
        self._seq = 0
        self._flushes = 0
        self._acked = 0
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        threading.Thread(target=self._run, name="gym-artifacts-handle-sender", daemon=True).start()

    def _next_frame(self) -> tuple[dict[str, Any], int] | None:
        """The buffered calls (up to a bound) as one frame, and how many calls it holds."""
        if not self.buffer:
            return None
        metrics: list[Any] = []
        rollouts: list[Any] = []
        frame: dict[str, Any] = {"m": metrics, "r": rollouts}
        with contextlib.suppress(IndexError):
            while len(metrics) + len(rollouts) < 10 * BATCH_CALLS:
                item = self.buffer.popleft()
                if item[0] == "m":
                    metrics.append(item[1:])
                elif item[0] == "r":
                    rollouts.append(item[1])
                else:
                    frame["flush"] = item[1]
        self._seq += 1
        frame.update(id=self.sender_id, seq=self._seq)
        return frame, len(metrics) + len(rollouts)

    def _deliver(self, frame: dict[str, Any]) -> None:
        if self._sock is None:
            sock = socket.create_connection(self.address, timeout=10)
            _send_frame(sock, {"secret": self.secret})
            self._sock = sock
        _send_frame(self._sock, frame)
        if "flush" in frame:
            reply = _recv_frame(self._sock)
            if not isinstance(reply, dict) or reply.get("applied") != frame["flush"]:
                raise OSError("the live run did not confirm the flush")
            with self._cond:
                self._acked = frame["flush"]
                self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.1
        unsent: tuple[dict[str, Any], int] | None = None
        while True:
            if unsent is None:
                self.wake.wait(SEND_INTERVAL_S)
                self.wake.clear()
                unsent = self._next_frame()
                if unsent is None:
                    continue
            try:
                self._deliver(unsent[0])
            except OSError as exc:
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                if self._sock is not None:
                    with contextlib.suppress(OSError):
                        self._sock.close()
                    self._sock = None
                self._drop_excess()
                time.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue  # the same frame again: the receiver skips it if it was applied
            self.stats.sent += unsent[1]
            unsent = None
            backoff = 0.1
            if self.buffer:
                self.wake.set()

    def _drop_excess(self) -> None:
        """While the driver is unreachable: drop the oldest metric calls past the bound."""
        excess = len(self.buffer) - MAX_BUFFERED_METRICS
        if excess <= 0:
            return
        kept: deque[tuple[Any, ...]] = deque()
        for item in list(self.buffer):
            if excess > 0 and item[0] == "m":
                excess -= 1
                self.stats.dropped += 1
                continue
            kept.append(item)
        self.buffer = kept

    def flush(self, timeout: float) -> bool:
        with self._cond:
            self._flushes += 1
            flush_id = self._flushes
        self.buffer.append(("f", flush_id))
        self.wake.set()
        with self._cond:
            return self._cond.wait_for(lambda: self._acked >= flush_id, timeout)


_senders: dict[tuple[str, int, str], _Sender] = {}
_senders_lock = threading.Lock()
_generation = [0]  # bumped in a forked child: its parent's senders (and threads) are not its own


def _forget_senders_after_fork() -> None:
    _senders.clear()
    _generation[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_senders_after_fork)


class LiveHandle:
    """A picklable stand-in for a live run, for other processes and nodes.

    ``export_metrics`` and ``export_rollouts`` only buffer (microseconds, never raise); ``flush``
    waits until the driver applied every earlier call (call it before a task or actor ends).
    Pickling keeps only the address and the secret.
    """

    __slots__ = ("_cache", "host", "port", "secret")

    def __init__(self, host: str, port: int, secret: str) -> None:
        self.host = host
        self.port = port
        self.secret = secret
        self._cache: tuple[int, _Sender] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (LiveHandle, (self.host, self.port, self.secret))

    def __repr__(self) -> str:
        return f"LiveHandle({self.host}:{self.port})"

    def _sender(self) -> _Sender:
        cache = self._cache
        if cache is not None and cache[0] == _generation[0]:
            return cache[1]
        key = (self.host, self.port, self.secret)
        with _senders_lock:
            sender = _senders.get(key)
            if sender is None:
                sender = _senders[key] = _Sender((self.host, self.port), self.secret)
        self._cache = (_generation[0], sender)
        return sender

    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log one step's metrics into the live run, with this call's time."""
        sender = self._sender()
        buffer = sender.buffer
        buffer.append(("m", dict(metrics), step, time.time()))
        if len(buffer) >= BATCH_CALLS:
            sender.wake.set()

    def export_rollouts(self, rollouts: list[Any]) -> None:
        """Hand finished rollouts to the live run's backends (never dropped)."""
        sender = self._sender()
        sender.buffer.append(("r", list(rollouts)))
        sender.wake.set()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the driver applied every call this process made; False on timeout."""
        return self._sender().flush(timeout)

    def stats(self) -> SenderStats:
        """This process's calls sent and dropped (buffer full while unreachable), last error."""
        return self._sender().stats


class NoOpHandle:
    """What ranks other than 0 hand out: the same methods, doing nothing."""

    def export_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...
    def export_rollouts(self, rollouts: list[Any]) -> None: ...
    def flush(self, timeout: float = 30.0) -> bool:
        return True


def default_host() -> str:
    """The address workers reach this process at: Ray's node address when Ray is running here."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return str(ray.util.get_node_ip_address())
    return "127.0.0.1"
