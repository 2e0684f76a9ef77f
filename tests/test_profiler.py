"""ChunkRangeProfiler with the real torch profiler on the CPU."""

from __future__ import annotations

import gzip
import json
import logging
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from gym_artifacts.runtime.profiler import ChunkRangeProfiler, parse_range  # noqa: E402


def work(dim: int = 64) -> None:
    a = torch.randn(dim, dim)
    (a @ a).relu().sum()


def profiler_open() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


@pytest.mark.slow
def test_range_2_to_4_of_8_chunks(tmp_path: Path) -> None:
    prof = ChunkRangeProfiler(tmp_path, "2,4")
    for i in range(8):
        with prof.chunk(i):
            work()
        assert prof.running == (2 <= i < 4)
    assert not profiler_open()
    trace = json.loads(gzip.decompress((tmp_path / "profile.pt.trace.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"chunk_2", "chunk_3", "chunk_4"} <= names
    assert not names & {"chunk_0", "chunk_1", "chunk_5", "chunk_7"}
    assert "aten::mm" in names
    summary = (tmp_path / "profile.summary.txt").read_text()
    assert "chunk_3" in summary and "Self CPU" in summary
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_body_raising_inside_range_leaves_no_open_profiler(tmp_path: Path) -> None:
    prof = ChunkRangeProfiler(tmp_path, "1,5")
    with pytest.raises(RuntimeError):
        for i in range(8):
            with prof.chunk(i):
                work()
                if i == 3:
                    raise RuntimeError("chunk failed")
    assert not prof.running and not profiler_open()
    assert "partial profile: chunk 3 raised" in (tmp_path / "profile.summary.txt").read_text()
    # A new profiler can start afterwards: nothing was left open.
    with torch.profiler.profile() as p:
        work()
    assert p.key_averages()


@pytest.mark.slow
def test_range_never_finished_is_closed_by_close(tmp_path: Path) -> None:
    prof = ChunkRangeProfiler(tmp_path, "2,10")
    for i in range(4):
        with prof.chunk(i):
            work()
    assert prof.running
    prof.close()
    assert not prof.running and not profiler_open()
    assert (tmp_path / "profile.pt.trace.json.gz").is_file()


@pytest.mark.parametrize("spec", ["3", "a,b", "5,2", "-1,2", "1,2,3"])
def test_invalid_ranges_are_warned_and_ignored(
    tmp_path: Path, spec: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert parse_range(spec) is None
    assert "EXPERIMENT_PROFILE_RANGE" in caplog.text
    out = tmp_path / "artifacts"
    prof = ChunkRangeProfiler(out, spec)
    with prof.chunk(2):
        work()
    assert not prof.running and not out.exists()


def test_other_ranks_do_not_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    out = tmp_path / "artifacts"
    prof = ChunkRangeProfiler(out, "0,1")
    with prof.chunk(0):
        work()
    assert not prof.running and not out.exists()


def test_range_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPERIMENT_PROFILE_RANGE", "0,0")
    prof = ChunkRangeProfiler(tmp_path)
    with prof.chunk(0):
        work()
    assert (tmp_path / "profile.pt.trace.json.gz").is_file()


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 6), length=st.integers(0, 4), chunks=st.integers(1, 5))
def test_finalize_closes_the_profiler_and_the_manifest_says_what_it_covers(
    tmp_path: Path, start: int, length: int, chunks: int
) -> None:
    """Any range against any number of chunks (``"2,4"`` with 3 chunks, the docs' example):
    after ``finalize`` the profiler is closed; a range that began has its trace and summary
    written and listed in the manifest, which says which chunks of the range never ran; a range
    that never began is a failure in the manifest, naming the range."""
    from gym_artifacts.runtime.session import ExperimentSession

    stop = start + length
    dpath = tmp_path / uuid.uuid4().hex
    session = ExperimentSession("exp", dpath)
    prof = ChunkRangeProfiler(dpath, f"{start},{stop}")
    for i in range(chunks):
        with prof.chunk(i):
            work(16)
    manifest = session.finalize()
    assert not prof.running and not profiler_open()
    names = {a["name"] for a in manifest["artifacts"]}
    failures = {f["artifact"]: f["error"] for f in manifest["failures"]}
    if start < chunks:  # the range began
        assert {"profile.pt.trace.json.gz", "profile.summary.txt"} <= names
        trace = json.loads(gzip.decompress((dpath / "profile.pt.trace.json.gz").read_bytes()))
        ran = {f"chunk_{i}" for i in range(start, min(stop, chunks - 1) + 1)}
        assert ran <= {e.get("name") for e in trace["traceEvents"]}
        note = manifest["profile"]
        assert (note["range"], note["profiled"]) == ([start, stop], [start, min(stop, chunks - 1)])
        assert note["never_ran"] == ([] if stop < chunks else [[chunks, stop]])
    else:
        assert "profile.pt.trace.json.gz" not in names
        assert f"{start},{stop}" in failures["profile.pt.trace.json.gz"]
