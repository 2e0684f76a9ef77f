"""``export_deadline`` bounds the whole post-run export of every backend that talks to a server
(MLflow, W&B online, LangSmith, Phoenix), even against a server that drips one byte every 2 s
(no read timeout ever fires) and a TCP black hole (issue 32).

Per backend, the CLI exports the quickstart run to both servers at once (two subprocesses, the
other timeouts left at their defaults) with ``export_deadline=20``: each ends FAILED with a
one-line reason within 20 s plus start-up (bounded at 60 s), exit 1, no traceback and no
receipt. In process, the abandoned request's socket is shut down by the export itself as it
reports FAILED (the server sees the connection closed), and the abandoned send connects nothing
more afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.load import scaled
from tests.processes import reaped
from tests.reliability.faulty_servers import AcceptLoop, black_hole, drip_server

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DEADLINE = 20
BOUND = 60  # the deadline plus the CLI's start-up (imports) on a loaded 2-core machine
DRIP_INTERVAL = 2.0


def settings(backend: str, uri: str, deadline: float) -> dict[str, Any]:
    """The backend pointed at ``uri``; every other timeout and retry left at its default."""
    return {
        "mlflow": {"tracking_uri": uri, "experiment_name": "deadline"},
        "wandb": {"mode": "online", "base_url": uri, "api_key": "x" * 40, "project": "deadline"},
        "langsmith": {"api_url": uri, "api_key": "ls-deadline-key"},
        "phoenix": {"base_url": uri},
    }[backend] | {"export_deadline": deadline}


BACKENDS = {"mlflow": "mlflow", "wandb": "wandb", "langsmith": "langsmith", "phoenix": "phoenix.client"}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_export_to_a_dripping_server_and_a_black_hole_ends_failed_within_the_deadline(
    backend: str, make_run: Any
) -> None:
    pytest.importorskip(BACKENDS[backend])
    runs = {kind: make_run() for kind in ("drip", "black-hole")}
    with drip_server(DRIP_INTERVAL) as drip, black_hole() as hole:
        servers = {"drip": drip, "black-hole": hole}
        procs, started = {}, time.monotonic()
        for kind, server in servers.items():
            overrides = [f"exporters.{backend}.{k}={v}" for k, v in settings(backend, server.uri, DEADLINE).items()]
            procs[kind] = subprocess.Popen(
                [sys.executable, "-m", "gym_artifacts.cli", "export", str(runs[kind]), "-e", backend, "--json",
                 *overrides],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=runs[kind].parent,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
        outcomes = {}
        with reaped(procs.values()):
            for kind, proc in procs.items():
                try:
                    out, err = proc.communicate(timeout=BOUND + 30 - (time.monotonic() - started))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{backend} at the {kind} server: no result within {BOUND + 30} s")
                outcomes[kind] = (proc.returncode, out, err, time.monotonic() - started)
        requests = {kind: getattr(server, "requests", None) for kind, server in servers.items()}
    for kind, (rc, out, err, elapsed) in outcomes.items():
        assert "Traceback" not in err, (kind, err[-3000:])
        assert rc == 1, (kind, rc, out, err[-2000:])
        [result] = json.loads(out)
        assert result["status"] == "FAILED", (kind, result)
        assert "\n" not in result["reason"] and "deadline" in result["reason"], (kind, result["reason"])
        assert elapsed < BOUND, (kind, elapsed)
        assert not list(runs[kind].parent.glob("*_export_done.json")), kind  # no receipt: nothing claimed sent
    assert requests["drip"], "the dripping server was never asked: the test proves nothing"


# -- in process: the export itself cuts the request off --------------------------------------------------
@dataclass
class HeldOpen(AcceptLoop):
    """Answers each request's headers, then holds the connection open without a byte more; records
    when the client closed each connection and counts them."""

    connections: int = 0
    closed_at: list[float] = field(default_factory=list)

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1
        threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        """Answer the headers once, then never the body: a request body that arrives in many
        reads must not get many header blocks (1,000 bytes of them would complete the body)."""
        answered = False
        with contextlib.suppress(OSError), conn:
            conn.settimeout(0.2)
            while not self.stopped.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                if not data:  # the client closed (or shut down) its end
                    self.closed_at.append(time.monotonic())
                    return
                if not answered:
                    answered = True
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")


@contextlib.contextmanager
def held_open() -> Iterator[HeldOpen]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = HeldOpen(sock)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopped.set()
        sock.close()
        thread.join(2)


@pytest.mark.parametrize("backend", ["mlflow", "langsmith", "phoenix"])
def test_the_abandoned_request_is_cut_off_by_the_export_itself(backend: str, quickstart_run: Path) -> None:
    pytest.importorskip(BACKENDS[backend])
    from omegaconf import OmegaConf

    from gym_artifacts import export_run

    deadline = scaled(3.0)  # on a loaded machine the export's own work before its first request grows
    with held_open() as server:
        cfg = OmegaConf.create({"exporters": {backend: {"enabled": True, **settings(backend, server.uri, deadline)}}})
        started = time.monotonic()
        [result] = export_run(quickstart_run, cfg, exporters=[backend])
        returned = time.monotonic()
        assert result.status.value == "FAILED" and "deadline" in result.reason, result
        assert returned - started < deadline + scaled(5), returned - started
        time.sleep(1.0)
        connections = server.connections
        assert connections >= 1, "the server was never asked"
        # every connection the export opened is closed by then: the export cut it off itself
        assert len(server.closed_at) == connections, (len(server.closed_at), connections)
        assert max(server.closed_at) < returned + scaled(0.5), [t - returned for t in server.closed_at]
        time.sleep(2.0)  # the abandoned send makes no further connection
        assert server.connections == connections
    assert not list(quickstart_run.parent.glob("*_export_done.json"))
