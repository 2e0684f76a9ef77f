"""A local HTTP endpoint answering as LangSmith's REST API documents, for the real ``langsmith`` client.

No LangSmith server runs outside LangSmith's cloud, so the tests point the real client here. It
keeps datasets, examples, projects (sessions), runs and feedback in memory, answers a repeated
run or feedback id with 409 Conflict (as LangSmith does) and logs every request as the client sent
it (method, path, headers, body) so tests can assert on exactly what went over the wire.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class State:
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    feedback: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    refuse_runs: bool = False  # answer every run batch with 500, as an overloaded server would
    throttle_runs: int = 0  # answer this many run batches with 429, as LangSmith's rate limit does
    lock: threading.Lock = field(default_factory=threading.Lock)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


class Handler(BaseHTTPRequestHandler):
    state: State
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: with Nagle's algorithm on, the second waits for the
    # client's delayed ACK (~40 ms a request), a stall LangSmith's own servers do not add.
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "1")  # the client waits this long (else 30 s) before again
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v for k, v in parse_qs(url.query).items()}
        with self.state.lock:
            self.state.requests.append(Request(method, url.path, dict(self.headers.items()), body))
            status, payload = self._route(method, url.path, query, body)
        self._reply(status, payload)

    do_GET = lambda self: self._handle("GET")  # noqa: E731
    do_POST = lambda self: self._handle("POST")  # noqa: E731
    do_PATCH = lambda self: self._handle("PATCH")  # noqa: E731

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        s = self.state
        parts = [p for p in path.split("/") if p]
        if path == "/info":
            return 200, {"version": "0.0.1", "batch_ingest_config": {"use_multipart_endpoint": False}}
        if parts == ["datasets"] and method == "POST":
            req = json.loads(body)
            if any(d["name"] == req["name"] for d in s.datasets.values()):
                return 409, {"detail": "Dataset with this name already exists."}
            ds = {**req, "id": str(uuid.uuid4()), "created_at": _now(), "modified_at": _now()}
            s.datasets[ds["id"]] = ds
            return 200, ds
        if parts == ["datasets"] and method == "GET":
            names = query.get("name", [])
            found = [d for d in s.datasets.values() if not names or d["name"] in names]
            return 200, found
        if len(parts) == 2 and parts[0] == "datasets" and method == "GET":
            ds = s.datasets.get(parts[1])
            return (200, ds) if ds else (404, {"detail": "not found"})
        if parts == ["examples", "bulk"] and method == "POST":
            created = json.loads(body)
            if any(e["id"] in s.examples for e in created):
                return 409, {"detail": "example already exists"}
            for e in created:
                s.examples[e["id"]] = e
            return 200, [{"id": e["id"]} for e in created]
        if parts == ["examples"] and method == "GET":
            dataset, ids = query.get("dataset", [None])[0], set(query.get("id", []))
            offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
            found = [
                {**e, "created_at": _now(), "modified_at": _now()}
                for e in s.examples.values()
                if (dataset is None or e["dataset_id"] == dataset) and (not ids or e["id"] in ids)
            ]
            return 200, found[offset : offset + limit]
        if parts == ["sessions"] and method == "POST":
            req = json.loads(body)
            for sess in s.sessions.values():
                if sess["name"] == req["name"]:
                    return (200, sess) if query.get("upsert") == ["true"] else (409, {"detail": "exists"})
            sess = {**req, "id": str(uuid.uuid4()), "tenant_id": str(uuid.UUID(int=0)), "start_time": _now()}
            s.sessions[sess["id"]] = sess
            return 200, sess
        if parts == ["sessions"] and method == "GET":
            names = query.get("name", [])
            return 200, [x for x in s.sessions.values() if not names or x["name"] in names]
        if len(parts) == 2 and parts[0] == "sessions" and method == "GET":
            sess = s.sessions.get(parts[1])
            return (200, sess) if sess else (404, {"detail": "not found"})
        if len(parts) == 2 and parts[0] == "sessions" and method == "PATCH":
            sess = s.sessions.get(parts[1])
            if sess is None:
                return 404, {"detail": "not found"}
            update = {k: v for k, v in json.loads(body).items() if v is not None}
            sess["extra"] = {**(sess.get("extra") or {}), **(update.pop("extra", None) or {})}
            sess.update(update)
            return 200, sess
        if parts == ["runs", "batch"] and method == "POST" and s.refuse_runs:
            return 500, {"detail": "internal error"}
        if parts == ["runs", "batch"] and method == "POST" and s.throttle_runs > 0:
            s.throttle_runs -= 1
            return 429, {"detail": "rate limit exceeded"}
        if parts == ["runs", "batch"] and method == "POST":
            req = json.loads(body)
            conflict = False
            for run in req.get("post", []):
                if run["id"] in s.runs:
                    conflict = True
                    continue
                s.runs[run["id"]] = run
            return (409, {"detail": "run already exists"}) if conflict else (202, {})
        if parts == ["runs", "query"] and method == "POST":
            req = json.loads(body)
            sessions = set(req.get("session") or [])
            found = [r for r in s.runs.values() if self._session_id(r) in sessions]
            return 200, {"runs": [self._run_out(r) for r in found], "cursors": {}}
        if parts == ["feedback"] and method == "POST":
            req = json.loads(body)
            if req["id"] in s.feedback:
                return 409, {"detail": "feedback already exists"}
            s.feedback[req["id"]] = req
            return 200, req
        if parts == ["feedback"] and method == "GET":
            run_ids = set(query.get("run", []))
            offset, limit = int(query.get("offset", ["0"])[0]), int(query.get("limit", ["100"])[0])
            found = [f for f in s.feedback.values() if not run_ids or f["run_id"] in run_ids]
            return 200, found[offset : offset + limit]
        return 404, {"detail": f"no route {method} {path}"}

    def _session_id(self, run: dict[str, Any]) -> str | None:
        name = run.get("session_name")
        for sess in self.state.sessions.values():
            if sess["name"] == name:
                return sess["id"]
        return run.get("session_id")

    def _run_out(self, run: dict[str, Any]) -> dict[str, Any]:
        return {**run, "session_id": self._session_id(run), "status": "success"}


class LangsmithApi:
    """The endpoint on 127.0.0.1 in a background thread; ``url`` for the client."""

    def __init__(self) -> None:
        self.state = State()
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> LangsmithApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
