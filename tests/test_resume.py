"""Resume markers, start_over, complete/certify/supersede, and the journal's post-run export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import RunIdMarker, read_marker, write_marker
from tests.backends import FailingLive
from tests.processes import reaped

REPO = Path(__file__).resolve().parent.parent

LOGGER = textwrap.dedent(
    """
    import sys, time
    from gym_artifacts.live import live_run
    store, out, first, last, resume, hang = sys.argv[1:7]
    cfg = {"exporters": {"local": {"enabled": True, "root": store, "experiment": "live"}},
           "resume": resume}
    with live_run(cfg, out) as live:
        for step in range(int(first), int(last)):
            live.export_metrics({"value": step * 10}, step=step)
        assert live.flush(10)
        print("ready", flush=True)
        if hang == "hang":
            time.sleep(120)
    """
)


def log_steps(store: Path, out: Path, first: int, last: int, *, resume: bool, kill: bool) -> None:
    args = [sys.executable, "-c", LOGGER, str(store), str(out), str(first), str(last), str(resume).lower()]
    proc = subprocess.Popen([*args, "hang" if kill else "exit"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    with reaped(proc):
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == (-9 if kill else 0)


def marker_of(out: Path) -> RunIdMarker:
    marker = read_marker(RunArtifacts.from_path(out).run_id_marker_fpath("local"))
    assert marker is not None
    return marker


def steps_in(store: Path, run_id: str) -> list[int]:
    lines = (store / "live" / run_id / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.slow
def test_killed_run_resumes_into_the_same_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out" / "eval.jsonl"
    log_steps(store, out, 0, 50, resume=False, kill=True)
    first = marker_of(out).run_id
    assert json.loads((store / "live" / first / "run.json").read_text())["status"] == "RUNNING"
    log_steps(store, out, 50, 100, resume=True, kill=False)
    assert marker_of(out).run_id == first
    assert steps_in(store, first) == list(range(100))
    assert json.loads((store / "live" / first / "run.json").read_text())["status"] == "FINISHED"
    journal = [
        json.loads(line)["step"] for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()
    ]
    assert journal == list(range(100))
    assert len(list((store / "live").iterdir())) == 1


@pytest.mark.slow
def test_fresh_run_into_same_output_gets_a_new_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    log_steps(store, out, 0, 10, resume=False, kill=True)
    first = marker_of(out).run_id
    log_steps(store, out, 0, 5, resume=False, kill=False)
    second = marker_of(out).run_id
    assert second != first
    assert steps_in(store, first) == list(range(10))
    assert steps_in(store, second) == list(range(5))
    # The earlier journal is set aside, never deleted; the new one holds only the new run.
    assert [
        json.loads(x)["step"] for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()
    ] == list(range(5))
    assert len(list(tmp_path.glob("eval_metrics.jsonl.replaced-*"))) == 1


def test_resume_without_marker_opens_a_new_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    log_steps(store, out, 0, 3, resume=True, kill=False)
    assert steps_in(store, marker_of(out).run_id) == [0, 1, 2]


def resume_cfg(store: Path) -> dict:
    return {
        "exporters": {"local": {"enabled": True, "root": str(store), "experiment": "live"}},
        "resume": True,
    }


def test_start_over_replaces_a_reopened_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    log_steps(store, out, 0, 5, resume=False, kill=False)
    old = marker_of(out).run_id
    with live_run(resume_cfg(store), out) as live:
        live.flush(5)
        assert live.exporters[0].reopened
        live.start_over()
        live.export_metrics({"value": 0}, step=0)
    new = marker_of(out).run_id
    assert new != old
    assert steps_in(store, old) == list(range(5))  # the old run's data is untouched
    assert (
        json.loads((store / "live" / old / "run.json").read_text())["status"] == "FINISHED"
    )  # reopen undone
    assert steps_in(store, new) == [0]


def test_start_over_is_a_noop_unless_reopened(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    with live_run(resume_cfg(store), out) as live:
        live.export_metrics({"value": 0}, step=0)
        live.flush(5)
        first = marker_of(out).run_id
        live.start_over()
        live.export_metrics({"value": 1}, step=1)
    assert marker_of(out).run_id == first
    assert steps_in(store, first) == [0, 1]


def test_start_over_leaves_a_marker_naming_another_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    log_steps(store, out, 0, 2, resume=False, kill=False)
    marker_fpath = RunArtifacts.from_path(out).run_id_marker_fpath("local")
    with live_run(resume_cfg(store), out) as live:
        live.flush(5)
        exporter = live.exporters[0]
        assert exporter.reopened
        # Another process took the output over; and no new run can be opened here.
        write_marker(marker_fpath, RunIdMarker(exporter="local", run_id="someone-else"))

        def no_new_run() -> str:
            raise ConnectionError("backend down")

        exporter._setup = no_new_run  # type: ignore[method-assign]
        live.start_over()
        live.flush(5)
    marker = read_marker(marker_fpath)
    assert marker is not None and marker.run_id == "someone-else"


def finish_run(out: Path) -> None:
    """Write what an eval writes at its end: rollouts and (newer) aggregate metrics."""
    out.write_text("".join(json.dumps({"id": i, "reward": i % 2}) + "\n" for i in range(10)))
    agg = [
        {"agent_ref": {"name": "a"}, "agent_metrics": {"mean/reward": 0.5}, "key_metrics": {"pass@1": 0.5}}
    ]
    out.with_name("eval_aggregate_metrics.json").write_text(json.dumps(agg))


def test_complete_then_certify_completes_the_live_run(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    with live_run(resume_cfg(store), out) as live:
        for step in range(5):
            live.export_metrics({"value": step}, step=step)
        finish_run(out)
        live.complete()
    marker = marker_of(out)
    assert marker.state == "completed" and marker.identities is not None
    cfg = OmegaConf.create(resume_cfg(store))
    [result] = export_run(out, cfg, certify=True)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.backend_run_id == marker.run_id
    run_json = json.loads((store / "live" / marker.run_id / "run.json").read_text())
    assert run_json["certified"] is True and run_json["status"] == "FINISHED"
    assert (store / "live" / marker.run_id / "summary.json").is_file()
    assert len(list((store / "live").iterdir())) == 1


@pytest.mark.parametrize("complete", [False, True])
def test_uncertifiable_live_run_is_superseded(tmp_path: Path, complete: bool) -> None:
    store, out = tmp_path / "store", tmp_path / "eval.jsonl"
    with live_run(resume_cfg(store), out) as live:
        live.export_metrics({"value": 1}, step=0)
        finish_run(out)
        if complete:
            live.complete()
    if complete:  # changed after completion: cannot be certified
        with open(out, "a") as fh:
            fh.write('{"id": 99}\n')
        out.with_name("eval_aggregate_metrics.json").touch()
    live_id = marker_of(out).run_id
    live_steps_before = (store / "live" / live_id / "metrics.jsonl").read_bytes()
    [result] = export_run(out, OmegaConf.create(resume_cfg(store)), certify=True)
    assert result.status is ExportStatus.EXPORTED
    assert result.backend_run_id != live_id
    live_json = json.loads((store / "live" / live_id / "run.json").read_text())
    assert live_json["superseded_by"] == result.backend_run_id
    assert (store / "live" / live_id / "metrics.jsonl").read_bytes() == live_steps_before
    assert marker_of(out).superseded_by == result.backend_run_id


def test_post_run_export_sends_the_journal_when_live_backends_failed(tmp_path: Path) -> None:
    registry.register(FailingLive)
    try:
        out = tmp_path / "eval.jsonl"
        with live_run({"exporters": {"failing": {"enabled": True}}}, out, teardown_timeout=1.0) as live:
            for step in range(30):
                live.export_metrics({"reward": step / 30}, step=step)
    finally:
        registry.unregister("failing")
    finish_run(out)
    journal = [json.loads(x) for x in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert [j["step"] for j in journal] == list(range(30))
    store = tmp_path / "store"
    [result] = export_run(
        out, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    )
    assert result.status is ExportStatus.EXPORTED
    sent = [
        json.loads(x)
        for x in (store / "default" / result.backend_run_id / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(s["step"], s["time"], s["metrics"]) for s in sent] == [
        (j["step"], j["time"], j["metrics"]) for j in journal
    ]


def test_automatic_steps_continue_after_the_previous_processs_last_step(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out" / "eval.jsonl"
    cfg = {"exporters": {"local": {"enabled": True, "root": str(store), "experiment": "live"}}, "resume": True}
    reopened = []
    for _ in range(2):  # the second block is a resumed process: same output, resume on
        with live_run(cfg, out) as live:
            for _ in range(3):
                live.export_metrics({"value": 1.0})  # no step: the automatic one
            assert live.flush(10)
            reopened.append(live.exporters[0].reopened)
    assert reopened == [False, True]
    journal = [json.loads(line)["step"] for line in out.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert journal == list(range(6))
    assert steps_in(store, marker_of(out).run_id) == list(range(6))
