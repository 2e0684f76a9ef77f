"""ExperimentSession: when it exists, atomic independent artifacts, crashes, and the export after."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.runtime.nvml import NVMLSampler
from gym_artifacts.runtime.session import ExperimentSession, maybe_build_session
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.processes import reaped

REPO = Path(__file__).resolve().parent.parent


def fake_sampler(**kwargs: Any) -> NVMLSampler:
    return NVMLSampler(
        nvml=FakeNvml([FakeGpu("GPU-s0")]), cuda_uuid=lambda i: None, publish_otel=False, **kwargs
    )


def test_no_experiment_id_means_no_session(tmp_path: Path) -> None:
    assert maybe_build_session(tmp_path / "out.jsonl") is None


def test_other_rank_means_no_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPERIMENT_ID", "e1")
    monkeypatch.setenv("RANK", "2")
    assert maybe_build_session(tmp_path / "out.jsonl") is None


def test_malformed_rank_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("EXPERIMENT_ID", "e1")
    monkeypatch.setenv("RANK", "first")
    session = maybe_build_session(tmp_path / "out.jsonl")
    assert session is not None
    assert "RANK='first' is not an integer" in caplog.text


@pytest.mark.parametrize("bad", ["../escape", "a/b", "..", "x\\y"])
def test_experiment_id_with_path_separators_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    caplog.set_level(logging.ERROR)
    monkeypatch.setenv("EXPERIMENT_ID", bad)
    assert maybe_build_session() is None
    assert "must be a plain name" in caplog.text


def test_artifacts_folder_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPERIMENT_ID", "e7")
    assert (
        maybe_build_session(tmp_path / "run" / "out.jsonl").artifacts_dpath
        == tmp_path / "run" / "out_artifacts"
    )
    assert maybe_build_session().artifacts_dpath == Path("/tmp/experiment-e7")
    monkeypatch.setenv("EXPERIMENT_ARTIFACTS_DIR", str(tmp_path / "explicit"))
    assert maybe_build_session(tmp_path / "out.jsonl").artifacts_dpath == tmp_path / "explicit"


def make_session(out: Path, monkeypatch: pytest.MonkeyPatch) -> ExperimentSession:
    monkeypatch.setenv("EXPERIMENT_ID", "exp-42")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    session = maybe_build_session(out, nvml_interval=0.1, sampler_factory=fake_sampler)
    assert session is not None
    return session


def test_full_session_then_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.media import write_dash_chunks

    out = tmp_path / "run" / "eval.jsonl"
    session = make_session(out, monkeypatch)
    session.mark_start(devices=[0])
    assert (
        json.loads((session.artifacts_dpath / "session_start.json").read_text())["experiment_id"] == "exp-42"
    )
    time.sleep(0.35)
    session.mark_end()
    chunks = tmp_path / "rec"
    write_dash_chunks(chunks, frames=30)
    manifest = session.finalize(derived_config={"model": "m", "fps": 10}, recording_session_dir=chunks)
    names = {a["name"] for a in manifest["artifacts"]}
    assert names == {
        "session_start.json",
        "session_times.json",
        "metrics_summary.json",
        "nvml_samples.jsonl",
        "derived_config.json",
        "recording.mp4",
    }
    assert manifest["failures"] == [] and manifest["recording"]["missing_ranges"] == []
    summary = json.loads((session.artifacts_dpath / "metrics_summary.json").read_text())
    assert summary["samples"] >= 2 and summary["devices"]["0"]["uuid"] == "GPU-s0"
    assert session.sampler is not None and not session.sampler._nvml.initialised  # nvmlShutdown ran
    # The eval's own files, then the export ships every runtime artifact.
    out.write_text('{"id": 1}\n')
    out.with_name("eval_aggregate_metrics.json").write_text(
        '[{"agent_ref": {"name": "a"}, "agent_metrics": {"r": 1}}]'
    )
    store = tmp_path / "store"
    [result] = export_run(
        out, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    )
    assert result.status is ExportStatus.EXPORTED, result.reason
    shipped = store / "default" / result.backend_run_id / "artifacts"
    assert {p.name for p in shipped.iterdir()} == names | {"manifest.json"}
    for name in names | {"manifest.json"}:
        assert (shipped / name).read_bytes() == (session.artifacts_dpath / name).read_bytes()


def test_unencodable_config_still_writes_everything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = make_session(tmp_path / "eval.jsonl", monkeypatch)
    session.mark_start()
    session.mark_end()
    manifest = session.finalize(derived_config={"callback": object(), "lr": float("nan")})
    names = {a["name"] for a in manifest["artifacts"]}
    assert {"session_start.json", "session_times.json", "metrics_summary.json"} <= names
    assert "derived_config.json" not in names
    [failure] = manifest["failures"]
    assert failure["artifact"] == "derived_config.json" and "not JSON serializable" in failure["error"]
    assert json.loads((session.artifacts_dpath / "manifest.json").read_text()) == manifest


def test_missing_recording_is_recorded_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = make_session(tmp_path / "eval.jsonl", monkeypatch)
    session.mark_start()
    manifest = session.finalize(recording_session_dir=tmp_path / "no-such-dir")
    assert [f["artifact"] for f in manifest["failures"]] == ["recording.mp4"]
    assert (session.artifacts_dpath / "session_times.json").is_file()


SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from gym_artifacts.runtime import session as session_mod
    out, mode, chunks = sys.argv[1:4]
    s = session_mod.maybe_build_session(out, nvml_interval=0.1)
    s.mark_start()
    if mode == "before-finalize":
        print("ready", flush=True)
        time.sleep(120)
    original = session_mod.assemble_recording
    def dying(session_dir, dest):
        import gym_artifacts.runtime.recording as rec
        real_copy = rec._copy_fd
        def copy_then_die(src_fd, dst_fd, size, method):
            n = real_copy(src_fd, dst_fd, size // 2, method)   # half of the first file is in the temp file
            os.kill(os.getpid(), signal.SIGKILL)
        rec._copy_fd = copy_then_die
        return original(session_dir, dest)
    session_mod.assemble_recording = dying
    s.finalize(derived_config={"a": 1}, recording_session_dir=chunks)
    """
)


@pytest.mark.parametrize("mode", ["before-finalize", "mid-finalize"])
def test_killed_session_leaves_no_half_written_artifact(tmp_path: Path, mode: str) -> None:
    from tests.media import write_dash_chunks

    chunks = tmp_path / "rec"
    write_dash_chunks(chunks, frames=20)
    out = tmp_path / "eval.jsonl"
    env = dict(os.environ, EXPERIMENT_ID="exp-kill")
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out), mode, str(chunks)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    with reaped(proc):
        assert proc.stdout is not None
        if mode == "before-finalize":
            assert proc.stdout.readline().strip() == "ready"
            os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -9
    folder = tmp_path / "eval_artifacts"
    visible = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    start = json.loads((folder / "session_start.json").read_text())
    assert start["experiment_id"] == "exp-kill" and start["pid"] == proc.pid
    if mode == "before-finalize":
        assert visible == {"session_start.json"}
    else:
        assert "recording.mp4" not in visible and "manifest.json" not in visible
        assert {"session_times.json", "metrics_summary.json", "derived_config.json"} <= visible
    for name in visible:
        if name.endswith(".json"):
            json.loads((folder / name).read_text())  # whole, never truncated
