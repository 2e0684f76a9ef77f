"""The live call's tail: median, p99, p99.9, max and calls over 1 ms of 50,000 ``export_metrics``
calls, with (a) local only, (b) local + MLflow (a real server) + W&B (offline), (c) the same with
the MLflow server killed after setup; each with the interpreter's default collector settings and,
as the reference, with ``gc.disable()`` during the calls. Every run is a fresh process, so no
run inherits another's heap.

Beside the threads (the shipped design), the same scenarios with the backends in a separate
process: the eval's process only encodes each call's record and writes it into a pipe; a child
process runs the same live fan-out (journal, queues, backends). That is the measurement the
choice between threads and a process is made on (see BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import struct
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import Row, idle_wakeup_cost_us, paced_metric_costs, run_measured, tail_summary

TARGET_P999_US = 100.0
TARGET_MAX_US = 5000.0  # one GIL switch interval
_FRAME = struct.Struct("<I")
_F_SETPIPE_SZ = 1031  # Linux fcntl: grow a pipe's buffer


class GcClock:
    """Counts the collections of each generation during a measurement, their longest pause,
    and how many ran in the measuring (the eval's) thread."""

    def __init__(self) -> None:
        self.caller = threading.get_ident()
        self.count = [0, 0, 0]
        self.longest_ms = [0.0, 0.0, 0.0]
        self.full_in_caller = 0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen = info["generation"]
        self.count[gen] += 1
        self.longest_ms[gen] = max(self.longest_ms[gen], (time.perf_counter() - self._started) * 1000)
        if gen == 2 and threading.get_ident() == self.caller:
            self.full_in_caller += 1

    def stop(self) -> dict[str, float]:
        gc.callbacks.remove(self._on_gc)
        return {
            "gen2": self.count[2],
            "gen2_longest_ms": self.longest_ms[2],
            "gen2_in_caller": self.full_in_caller,
            "gen1": self.count[1],
            "gen1_longest_ms": self.longest_ms[1],
        }


@contextlib.contextmanager
def _measured(gc_off: bool) -> Iterator[dict]:
    """Collector statistics for the block; ``gc_off`` disables the collector for it."""
    stats: dict = {}
    clock = GcClock()
    if gc_off:
        gc.disable()
    try:
        yield stats
    finally:
        stats.update(clock.stop())
        gc.enable()


class FloorFanout:
    """The caller's own work with no worker anywhere: encode the record, append it to four
    queues (journal and three backends) that nobody reads, cleared now and then."""

    def __init__(self) -> None:
        from gym_artifacts.run.metric_records import encode_record

        self._encode = encode_record
        self._queues: list[deque[bytes]] = [deque() for _ in range(4)]

    def export_metrics(self, metrics: dict, step: int | None = None) -> None:
        record = self._encode(metrics, step, time.time())
        for queue in self._queues:
            queue.append(record)  # type: ignore[arg-type]
        if len(self._queues[0]) >= 1000:
            for queue in self._queues:
                queue.clear()


def measure_floor(cfg: dict, out: str, calls: int, gc_off: bool, kill_pgid: int) -> dict:
    """In the measured process: the same work and pacing with no thread or process behind it.
    What the machine itself (scheduler, other processes on the cores) adds to such a call."""
    with _measured(gc_off) as stats:
        costs = paced_metric_costs(FloorFanout(), calls)
    return {**tail_summary(costs), **stats, "wakeup_noop_us": idle_wakeup_cost_us()}


def measure_threads(cfg: dict, out: str, calls: int, gc_off: bool, kill_pgid: int) -> dict:
    """In the measured process: the shipped design (backend workers are threads of this process)."""
    import signal

    from gym_artifacts.live import live_run

    with live_run(cfg, out, teardown_timeout=10) as live:
        live.flush(120)
        if kill_pgid:
            os.killpg(kill_pgid, signal.SIGKILL)  # the MLflow server dies after setup
        with _measured(gc_off) as stats:
            costs = paced_metric_costs(live, calls)
    return {**tail_summary(costs), **stats}


class PipeFanout:
    """The eval's side of a fan-out in another process: encode the call, write it to a pipe.

    The pipe is non-blocking: a call never waits for the other process; when the pipe is full,
    the call is dropped and counted (as a full queue drops metrics in the threaded design).
    """

    def __init__(self, fd: int) -> None:
        from gym_artifacts.run.metric_records import encode_record

        self._encode = encode_record
        self._fd = fd
        self.dropped = 0

    def export_metrics(self, metrics: dict, step: int | None = None) -> None:
        record = self._encode(metrics, step, time.time())
        try:
            os.write(self._fd, _FRAME.pack(len(record)) + record)  # < PIPE_BUF: all or nothing
        except BlockingIOError:
            self.dropped += 1


def measure_process(cfg: dict, out: str, calls: int, gc_off: bool, kill_pgid: int) -> dict:
    """In the measured process: the backends run in a child; this process only writes records."""
    import fcntl
    import subprocess

    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n"
    code += "from benchmarks.tail import serve_from_pipe; serve_from_pipe(*sys.argv[1:])"
    child = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(cfg), out, str(kill_pgid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline() != b"ready\n":
        raise RuntimeError("the backend process did not start")
    fd = child.stdin.fileno()
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
    os.set_blocking(fd, False)
    fanout = PipeFanout(fd)
    with _measured(gc_off) as stats:
        costs = paced_metric_costs(fanout, calls)
    os.set_blocking(fd, True)
    child.stdin.close()
    child.wait(120)
    return {**tail_summary(costs), **stats, "pipe_dropped": fanout.dropped}


def serve_from_pipe(cfg_json: str, out: str, kill_pgid: str) -> None:
    """The backend process: the live fan-out fed with the records read from stdin."""
    import signal

    from gym_artifacts.live import live_run

    stdin = sys.stdin.buffer
    with live_run(json.loads(cfg_json), out, teardown_timeout=10) as live:
        live.flush(120)
        if int(kill_pgid):
            os.killpg(int(kill_pgid), signal.SIGKILL)
        sys.stdout.buffer.write(b"ready\n")
        sys.stdout.buffer.flush()
        pending = b""
        while chunk := stdin.read1(1 << 16):
            pending += chunk
            pos = 0
            while len(pending) - pos >= _FRAME.size:
                (size,) = _FRAME.unpack_from(pending, pos)
                end = pos + _FRAME.size + size
                if end > len(pending):
                    break
                live.export_record(pending[pos + _FRAME.size : end])
                pos = end
            pending = pending[pos:]


def _measure_in_fresh_process(
    mode: str, cfg: dict, out: Path, calls: int, gc_off: bool, kill_pgid: int = 0
) -> dict:
    code = (
        f"from benchmarks.tail import measure_{mode}\n"
        f"__result.update(measure_{mode}({cfg!r}, {str(out)!r}, {calls}, {gc_off}, {kill_pgid}))"
    )
    env = {"WANDB_SILENT": "true", "WANDB_DIR": str(out.parent / "wandb")}
    return run_measured(code, env=env)


def _figure(r: dict) -> str:
    return (
        f"p50 {r['median']:.1f} / p99 {r['p99']:.0f} / p99.9 {r['p999']:.0f} / max {r['max']:,.0f} us; "
        f"{r['over_1ms']} > 1 ms; full GCs {r['gen2']} (longest {r['gen2_longest_ms']:.0f} ms); "
        f"right after a pause: p50 {r['after_pause_median']:.0f} us; the other calls: "
        f"p99.9 {r['unpaused_p999']:.0f} / max {r['unpaused_max']:,.0f} us"
    )


def _row(name: str, r: dict, ref: dict | None) -> Row:
    baseline = "-"
    if ref:
        baseline = f"gc off: p99.9 {ref['p999']:.0f} / max {ref['max']:,.0f} us; {ref['over_1ms']} > 1 ms"
    met = r["p999"] <= TARGET_P999_US and r["max"] <= TARGET_MAX_US
    ratio = r["max"] / ref["max"] if ref and ref["max"] else None
    return Row(name, _figure(r), baseline, ratio, "p99.9 <= 100 us, max <= 5 ms", met)


def run(tiny: bool) -> list[Row]:
    from benchmarks.live import _config
    from tests.mlflow_server import MlflowServer, free_port

    calls = 2_000 if tiny else 50_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-tail-") as tmp_name:
        tmp = Path(tmp_name)

        def fresh_server(tag: str) -> MlflowServer:
            return MlflowServer(tmp / f"server-{tag}", free_port()).start(timeout=300)  # a loaded machine

        def one(tag: str, mode: str, cfg: dict, gc_off: bool, kill: MlflowServer | None = None) -> dict:
            out = tmp / tag / "eval.jsonl"
            out.parent.mkdir(parents=True)
            pgid = kill.proc.pid if kill is not None and kill.proc is not None else 0
            result = _measure_in_fresh_process(mode, cfg, out, calls, gc_off, pgid)
            print(f"  tail {tag}: {json.dumps(result)}", file=sys.stderr, flush=True)
            return result

        local_only = {"exporters": {"local": {"enabled": True, "root": str(tmp / "local")}}}
        load_before = os.getloadavg()[0]
        floor = one("floor", "floor", {}, False)
        alive = fresh_server("alive") if not tiny else None
        try:
            three = _config(tmp, alive.uri if alive is not None else "")
            scenarios: list[tuple[str, str, dict, bool]] = [
                ("(a) local only", "a", local_only, False),
                ("(b) local + MLflow + W&B", "b", three, False),
                ("(c) MLflow server dead", "c", three, True),
            ]
            if tiny:  # the harness check: one scenario (each MLflow one costs a server and SDK imports)
                scenarios = scenarios[:1]
            for title, key, cfg, dead in scenarios:
                results = {}
                for mode, gc_off in (("threads", False), ("threads", True), ("process", False)):
                    server = fresh_server(f"{key}-{mode}-{gc_off}") if dead else None
                    try:
                        run_cfg = _config(tmp, server.uri) if server is not None else cfg
                        tag = f"{key}-{mode}-{'gcoff' if gc_off else 'gc'}"
                        results[(mode, gc_off)] = one(tag, mode, run_cfg, gc_off, server)
                    finally:
                        if server is not None:
                            server.stop()
                ref = results[("threads", True)]
                rows.append(_row(f"tail {title}, threads (shipped)", results[("threads", False)], ref))
                rows.append(_row(f"tail {title}, threads, gc.disable()", ref, None))
                rows.append(_row(f"tail {title}, backends in a process", results[("process", False)], ref))
        finally:
            if alive is not None:
                alive.stop()
        load = (
            f"load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end; an empty call "
            f"right after the same pause: p50 {floor['wakeup_noop_us']:.1f} us"
        )
        name = "tail floor: the call's own work, no worker behind it"
        rows.append(Row(name, _figure(floor), load, None, "reference", None))
    return rows
