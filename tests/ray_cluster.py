"""A real local Ray cluster for tests and benchmarks: a head and more nodes on this machine.

Each node is started with ``ray start`` (the second with ``--address`` of the head, as a node of
another machine would join) in its own process group, with one CPU, a small object store and no
dashboard, under a private temporary folder. ``stop`` kills every node's process group (raylet,
GCS, workers) and waits, so nothing outlives the test session.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.mlflow_server import free_port
from tests.processes import run_bounded

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MB; jobs and results are small
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}


@dataclass
class RayCluster:
    """Nodes started with ``ray start``; ``address`` is the head's GCS address."""

    cpus_per_node: int = 1
    port: int = field(default_factory=free_port)
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gar-", dir="/tmp")))
    groups: list[int] = field(default_factory=list)  # one process group per node
    nodes: int = 0

    def __post_init__(self) -> None:
        token = self.temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)

    @property
    def env(self) -> dict[str, str]:
        """What a driver needs in its environment to join (Ray's token authentication)."""
        return {**RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.temp_dir / "auth_token")}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ray_start(self, make_args: Callable[[], list[str]], timeout: float, attempts: int = 3) -> None:
        """``ray start`` with ``make_args()``, tried again when it fails (Ray gives a node 30 s to
        register, which a loaded 2-core machine may miss), each failed attempt's processes killed."""
        env = dict(os.environ, **self.env)
        env.pop("RAY_ADDRESS", None)
        output = ""
        for attempt in range(attempts):
            cmd = [
                sys.executable, "-m", "ray.scripts.scripts", "start", *make_args(),
                "--num-cpus", str(self.cpus_per_node), "--object-store-memory", str(OBJECT_STORE_BYTES),
                "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
            ]  # fmt: skip
            log = self.temp_dir / f"ray-start-{self.nodes}-{attempt}.log"
            with open(log, "wb") as fh:
                proc = subprocess.Popen(
                    cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                rc = None
            if rc == 0:
                self.groups.append(proc.pid)  # the daemons it leaves keep its process group
                self.nodes += 1
                return
            output = log.read_text(errors="replace")[-3000:]
            _kill(_descendants({pid for pid, pgid in _processes().items() if pgid == proc.pid}))
        raise RuntimeError(f"ray start failed {attempts} times: {output}")

    def _head_args(self) -> list[str]:
        self.port = free_port()  # a fresh port for each attempt
        return [
            "--head", "--port", str(self.port), "--include-dashboard", "false",
            "--ray-client-server-port", str(free_port()), "--dashboard-port", str(free_port()),
            "--temp-dir", str(self.temp_dir),
        ]  # fmt: skip

    def start(self, nodes: int = 1, timeout: float = 180.0) -> RayCluster:
        """The head, then ``nodes - 1`` more nodes joining it; waits until all are up."""
        try:
            self._ray_start(self._head_args, timeout)
            for _ in range(nodes - 1):
                self.add_node(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, timeout: float = 180.0) -> None:
        """One more node joining the head, as ``ray start --address`` on another machine would."""
        self._ray_start(lambda: ["--address", self.address], timeout)
        self.wait_for_nodes(self.nodes, timeout)

    def wait_for_nodes(self, count: int, timeout: float) -> None:
        """Until the head's GCS lists ``count`` live nodes."""
        code = (
            "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            proc = run_bounded(
                [sys.executable, "-c", code, self.address],
                capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **self.env),
            )  # fmt: skip
            lines = proc.stdout.strip().splitlines()
            alive = int(lines[-1]) if lines and lines[-1].isdigit() else 0
            if alive >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"only {alive} of {count} Ray nodes up after {timeout}s")

    def worker_pids(self, title: str) -> list[int]:
        """This cluster's processes whose title starts with ``title`` (``ray::<task name>``)."""
        pids = []
        for pid in self._members():
            try:
                cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if cmdline.decode(errors="replace").startswith(title):
                pids.append(pid)
        return pids

    def _members(self) -> set[int]:
        """Every process of the nodes: their groups and (workers have sessions of their own)
        every descendant."""
        return _descendants({pid for pid, pgid in _processes().items() if pgid in self.groups})

    def stop(self) -> None:
        """TERM every node's processes, then KILL what is left; remove the temporary folder."""
        _kill(self._members())  # found before anything is killed
        self.groups.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill(pids: set[int]) -> None:
    """TERM, then KILL what is left after a grace period; waits until all are gone."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: state, ppid, pgid, ..."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _processes() -> dict[int, int]:
    """Every process's process group."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            out[int(entry.name)] = int(fields[2])
    return out


def _descendants(roots: set[int]) -> set[int]:
    parents = {}
    for pid in _processes():
        fields = _stat_fields(pid)
        if fields is not None:
            parents[pid] = int(fields[1])
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited process not yet reaped counts as gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"
