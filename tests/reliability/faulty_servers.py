"""Misbehaving servers on 127.0.0.1 for fault injection: a TCP black hole, an HTTP server that
answers errors (500, 429 with Retry-After), and one that answers slowly. Each runs on a daemon
thread, counts the requests it saw and stops by itself when closed."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar


@dataclass
class AcceptLoop:
    """A listening socket whose accept loop hands each connection to ``_accepted`` until stopped."""

    sock: socket.socket
    stopped: threading.Event = field(default_factory=threading.Event, kw_only=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


AcceptLoopT = TypeVar("AcceptLoopT", bound=AcceptLoop)


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextlib.contextmanager
def _serving(server: AcceptLoopT) -> Iterator[AcceptLoopT]:
    """Run ``server``'s accept loop on a daemon thread while the block runs; close it after."""
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.close()
        thread.join(2)


@dataclass
class BlackHole(AcceptLoop):
    """Accepts connections and never answers (nor closes them) until stopped."""

    held: list[socket.socket] = field(default_factory=list)

    def _accepted(self, conn: socket.socket) -> None:
        self.held.append(conn)

    def close(self) -> None:
        self.stopped.set()
        for conn in self.held:
            with contextlib.suppress(OSError):
                conn.close()
        self.sock.close()


def black_hole() -> contextlib.AbstractContextManager[BlackHole]:
    return _serving(BlackHole(_listening()))


@dataclass
class HttpFault:
    """What the HTTP server does with every request."""

    status: int = 500
    retry_after: int | None = None
    delay: float = 0.0
    body: bytes = b'{"error_code": "INTERNAL_ERROR", "message": "injected fault"}'
    requests: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fault: HttpFault


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        fault = self.server.fault
        fault.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        if fault.delay:
            time.sleep(fault.delay)
        self.send_response(fault.status)
        if fault.retry_after is not None:
            self.send_header("Retry-After", str(fault.retry_after))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(fault.body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(fault.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        return


@contextlib.contextmanager
def _http_serving(server: ThreadingHTTPServer) -> Iterator[str]:
    """Serve on a daemon thread while the block runs (yields the URI); shut down after."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def http_fault(fault: HttpFault) -> Iterator[tuple[str, HttpFault]]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fault = fault
    with _http_serving(server) as uri:
        yield uri, fault


@dataclass
class DripServer(AcceptLoop):
    """Answers every request with a 200 whose body arrives one byte every ``interval`` seconds,
    forever: no read timeout ever fires, only an overall deadline ends the client's wait."""

    interval: float = 1.0
    requests: int = 0

    def _accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            self.requests += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
            while not self.stopped.wait(self.interval):
                conn.sendall(b" ")


def drip_server(interval: float = 1.0) -> contextlib.AbstractContextManager[DripServer]:
    return _serving(DripServer(_listening(), interval))


@dataclass
class ProxyPolicy:
    """What a proxy on 127.0.0.1 does with a request before (or instead of) forwarding it, and
    how many forwarded requests it holds now (``in_flight``)."""

    target: str
    in_flight: int = field(default=0, kw_only=True)
    lock: threading.Lock = field(default_factory=threading.Lock, kw_only=True)

    def hold_s(self, method: str, path: str) -> float:
        """Seconds to hold the request before forwarding it (0: none)."""
        return 0.0

    def answer(self, method: str, path: str) -> tuple[int, bytes] | None:
        """``(status, body)`` to answer instead of forwarding; None: forward the request."""
        return None

    def hold(self, method: str, path: str) -> None:
        """Wait before forwarding the request (by default ``hold_s`` seconds)."""
        seconds = self.hold_s(method, path)
        if seconds:
            time.sleep(seconds)

    def close(self) -> None:
        """The proxy stops: release whatever is held."""


@dataclass
class DelayingProxy(ProxyPolicy):
    """Forwards every request to ``target``; the first ``times`` requests whose path ends with
    ``suffix`` are held ``delay`` seconds first (the server still gets and applies them)."""

    suffix: str
    delay: float
    times: int = 1
    delayed: int = 0

    def hold_s(self, method: str, path: str) -> float:
        with self.lock:
            hold = path.split("?")[0].endswith(self.suffix) and self.delayed < self.times
            self.delayed += hold
        return self.delay if hold else 0.0


# What a server (or the reverse proxy before it) answers when it refuses: MLflow's JSON error
# document, or a proxy's HTML page. The marker lets a test find the server's words in a reason.
REFUSAL_MARKER = "refused by the test proxy"
REFUSAL_CODES = {400: "INVALID_PARAMETER_VALUE", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "ENDPOINT_NOT_FOUND", 409: "RESOURCE_ALREADY_EXISTS", 422: "INVALID_PARAMETER_VALUE"}  # fmt: skip


def refusal_body(status: int, kind: str) -> bytes:
    """The body of a refusal: ``json`` (MLflow's error document) or ``html`` (a reverse proxy's)."""
    if kind == "json":
        code = REFUSAL_CODES.get(status, "BAD_REQUEST")
        return json.dumps({"error_code": code, "message": f"{REFUSAL_MARKER} ({status})"}).encode()
    return f"<html><body><h1>{status}</h1><p>{REFUSAL_MARKER}</p></body></html>".encode()


@dataclass
class RefusingProxy(ProxyPolicy):
    """Forwards every request to ``target`` except those whose path holds ``endpoint`` (and
    whose method is ``method``, when given): answered ``status`` with ``body``, never forwarded
    (the server never sees them)."""

    endpoint: str
    status: int
    body: bytes = b""
    method: str | None = None
    refused: int = 0

    def answer(self, method: str, path: str) -> tuple[int, bytes] | None:
        if self.endpoint not in path.split("?")[0] or self.method not in (None, method):
            return None
        with self.lock:
            self.refused += 1
        return self.status, self.body


@dataclass
class HoldingProxy(ProxyPolicy):
    """Forwards every request to ``target``; while ``holding``, those whose path holds
    ``endpoint`` are held (the server answers nothing, as one that accepts and never answers)
    until the proxy closes. ``held`` counts them: the event a test waits for."""

    endpoint: str
    holding: bool = True
    held: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def hold(self, method: str, path: str) -> None:
        if self.holding and self.endpoint in path.split("?")[0]:
            with self.lock:
                self.held += 1
            self.released.wait()

    def close(self) -> None:
        self.released.set()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: ProxyPolicy


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ProxyServer

    def _forward(self) -> None:
        import http.client
        from urllib.parse import urlsplit

        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = self._read_chunked()  # requests sends an empty file upload chunked
        answer = proxy.answer(self.command, self.path)
        if answer is not None:
            self._reply(answer[0], [("Content-Type", "application/json")], answer[1])
            return
        with proxy.lock:
            proxy.in_flight += 1
        try:
            proxy.hold(self.command, self.path)
            target = urlsplit(proxy.target)
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            dropped = ("host", "connection", "transfer-encoding", "content-length")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders()
                    if k.lower() not in ("transfer-encoding", "connection", "content-length")]  # fmt: skip
            self._reply(response.status, kept, data)
            conn.close()
        finally:
            with proxy.lock:
                proxy.in_flight -= 1

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()  # the blank line after the last chunk
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format: str, *args: object) -> None:
        return


@contextlib.contextmanager
def proxy(policy: ProxyPolicy) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of ``policy.target``; yields its URI."""
    server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
    server.proxy = policy
    try:
        with _http_serving(server) as uri:
            yield uri
    finally:
        policy.close()


def delaying_proxy(policy: DelayingProxy) -> contextlib.AbstractContextManager[str]:
    """A proxy on 127.0.0.1 in front of ``policy.target``; yields its URI."""
    return proxy(policy)
