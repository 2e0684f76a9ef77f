"""The serializable live handle without Ray: another process's calls land once in the live run."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import pickle
import socket
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.live import live_run
from gym_artifacts.live.handle import HandleReceiver, LiveHandle, _send_frame


def _log_from_child(handle: LiveHandle, calls: int, queue: Any) -> None:
    for j in range(calls):
        handle.export_metrics({"child/x": j, "nan": float("nan")}, step=j)
    handle.export_rollouts([{"from": "child"}])
    queue.put(handle.flush(60))


def local_cfg(tmp_path: Path) -> dict[str, Any]:
    return {"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}}


def test_a_spawned_process_logs_through_a_pickled_handle(tmp_path: Path) -> None:
    out = tmp_path / "run" / "eval.jsonl"
    out.parent.mkdir()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with live_run(local_cfg(tmp_path), out) as live:
        handle = live.handle()
        assert pickle.loads(pickle.dumps(handle)).port == handle.port
        child = ctx.Process(target=_log_from_child, args=(handle, 3000, queue))
        child.start()
        assert queue.get(timeout=120) is True
        child.join(30)
        live.export_metrics({"driver/y": 1.0}, step=0)
    assert [r.lost for r in live.reports] == [0]
    lines = [json.loads(x) for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    child_steps = sorted(e["step"] for e in lines if "child/x" in e["metrics"])
    assert child_steps == list(range(3000))  # every call once, with its step
    assert all(e["metrics"]["nan"] != e["metrics"]["nan"] for e in lines if "nan" in e["metrics"])  # NaN kept
    [run_dir] = list((tmp_path / "store" / "default").iterdir())
    assert (run_dir / "rollouts.jsonl").read_text().count('"from":"child"') == 1


def test_a_connection_without_the_secret_applies_nothing() -> None:
    applied: list[Any] = []
    receiver = HandleReceiver(lambda *a: applied.append(a), applied.append, "127.0.0.1")
    try:
        with socket.create_connection(receiver.address, timeout=10) as sock:
            _send_frame(sock, {"secret": "guess"})
            _send_frame(sock, {"id": "x", "seq": 1, "m": [[{"a": 1}, 0, 0.0]], "r": []})
            sock.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # the receiver hung up or reset
                assert sock.recv(1) == b""
        handle = LiveHandle(*receiver.address, secret="wrong")
        handle.export_metrics({"a": 1}, step=0)
        assert handle.flush(1.0) is False
    finally:
        receiver.close()
    assert applied == [] and receiver.refused >= 1


def test_a_frame_sent_again_after_a_broken_connection_is_applied_once() -> None:
    applied: list[Any] = []
    receiver = HandleReceiver(lambda *a: applied.append(a), applied.append, "127.0.0.1")
    frame = {"id": "sender", "seq": 1, "m": [[{"a": 1}, 0, 0.0]], "r": [[{"r": 1}]]}
    try:
        receiver._apply(frame)
        receiver._apply(frame)  # the resend of a frame whose acknowledgement was lost
        receiver._apply({**frame, "seq": 2})
    finally:
        receiver.close()
    assert len(applied) == 4


def test_calls_after_the_run_ended_are_not_applied_and_never_raise(tmp_path: Path) -> None:
    out = tmp_path / "run" / "eval.jsonl"
    out.parent.mkdir()
    with live_run(local_cfg(tmp_path), out) as live:
        handle = live.handle()
        handle.export_metrics({"x": 1}, step=0)
        assert handle.flush(30)
    handle.export_metrics({"x": 2}, step=1)  # the driver is gone: buffered, never raises
    assert handle.flush(0.5) is False
    lines = out.with_name("eval_metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0]


@pytest.mark.parametrize("rank", ["1"])
def test_other_ranks_get_a_no_op_handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: str) -> None:
    monkeypatch.setenv("RANK", rank)
    with live_run(local_cfg(tmp_path), tmp_path / "eval.jsonl") as live:
        handle = live.handle()
        handle.export_metrics({"x": 1})
        assert handle.flush() is True
    assert not (tmp_path / "eval_metrics.jsonl").exists()
