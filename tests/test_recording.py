"""Recording assembly from real fragmented MP4 chunks made with PyAV, decoded back."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("av")

from gym_artifacts.core.errors import RunError
from gym_artifacts.runtime.recording import assemble_recording
from tests.media import decode_frame_count, write_dash_chunks


@pytest.fixture
def twelve_chunks(tmp_path: Path) -> Path:
    session = tmp_path / "session"
    chunks = write_dash_chunks(session, frames=120, fps=10)  # one-second fragments: chunk_1 .. chunk_12
    assert [c.name for c in chunks][-1] == "chunk_12.m4s" and len(chunks) == 12
    return session


def frames_in(session: Path, indexes: list[int]) -> int:
    """Frames of the given chunks, decoded each on its own behind the init segment."""
    total = 0
    for i in indexes:
        probe = session.parent / f"probe_{i}.mp4"
        probe.write_bytes((session / "init.mp4").read_bytes() + (session / f"chunk_{i}.m4s").read_bytes())
        total += decode_frame_count(probe)
    return total


def test_chunks_assemble_in_index_order_with_a_gap(twelve_chunks: Path, tmp_path: Path) -> None:
    present = [i for i in range(1, 13) if i != 5]
    expected_frames = frames_in(twelve_chunks, present)
    (twelve_chunks / "chunk_5.m4s").unlink()
    dest = tmp_path / "out" / "recording.mp4"
    report = assemble_recording(twelve_chunks, dest)
    assert report.missing_ranges == [(5, 5)] and report.missing_count == 1
    assert report.chunks == 11 and (report.first_index, report.last_index) == (1, 12)
    expected = (twelve_chunks / "init.mp4").read_bytes() + b"".join(
        (twelve_chunks / f"chunk_{i}.m4s").read_bytes() for i in present
    )
    assert dest.read_bytes() == expected  # chunk_10..12 after chunk_9, not after chunk_1
    assert decode_frame_count(dest) == expected_frames > 100
    assert report.bytes == len(expected)
    assert report.method in ("copy_file_range", "sendfile")


def test_ordering_past_99999(twelve_chunks: Path, tmp_path: Path) -> None:
    for i, new in zip(range(1, 4), (99_998, 99_999, 100_000), strict=True):
        (twelve_chunks / f"chunk_{i}.m4s").rename(twelve_chunks / f"chunk_{new}.m4s")
    for i in range(4, 13):
        (twelve_chunks / f"chunk_{i}.m4s").unlink()
    report = assemble_recording(twelve_chunks, tmp_path / "r.mp4")
    assert (report.first_index, report.last_index, report.missing_ranges) == (99_998, 100_000, [])
    assert decode_frame_count(tmp_path / "r.mp4") == 30


@pytest.mark.parametrize("broken", [["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_fallbacks_give_the_same_bytes(
    twelve_chunks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: list[str]
) -> None:
    reference = tmp_path / "ref.mp4"
    assemble_recording(twelve_chunks, reference)

    def unsupported(*_args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    for name in broken:
        monkeypatch.setattr(os, name, unsupported)
    report = assemble_recording(twelve_chunks, tmp_path / "fallback.mp4")
    assert report.method == ("sendfile" if broken == ["copy_file_range"] else "buffered")
    assert (tmp_path / "fallback.mp4").read_bytes() == reference.read_bytes()


def test_no_init_segment_is_an_error_and_publishes_nothing(twelve_chunks: Path, tmp_path: Path) -> None:
    (twelve_chunks / "init.mp4").unlink()
    with pytest.raises(RunError, match=r"no init\.mp4"):
        assemble_recording(twelve_chunks, tmp_path / "r.mp4")
    assert not (tmp_path / "r.mp4").exists()


@contextlib.contextmanager
def data_limit(extra: int) -> Iterator[None]:
    """This process may allocate at most ``extra`` more bytes of data while inside (RLIMIT_DATA):
    a code path whose memory follows the VALUES of indices fails with MemoryError instead of
    taking the machine's memory."""
    import resource

    used = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmData:")
    )
    old = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (used + extra, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)


@pytest.fixture(scope="module")
def three_chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    session = tmp_path_factory.mktemp("three") / "session"
    write_dash_chunks(session, frames=30, fps=10)  # chunk_1 .. chunk_3
    return session


def _gaps(indexes: list[int]) -> list[tuple[int, int]]:
    return [(a + 1, b - 1) for a, b in itertools.pairwise(indexes) if b - a > 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    indexes=st.lists(
        st.one_of(st.integers(0, 10), st.integers(0, 2**64), st.just(1_733_212_800)),
        min_size=1, max_size=4, unique=True,
    )
)
def test_memory_follows_the_chunks_present_never_the_values_of_their_indexes(
    three_chunks: Path, tmp_path: Path, indexes: list[int]
) -> None:
    """``chunk_1733212800.m4s`` beside ``chunk_0..2`` (a clock's seconds as a chunk number): the
    gaps are reported as ranges, the recording is assembled in index order, and memory stays that
    of the chunks present (a list of every missing index would take gigabytes)."""
    session = tmp_path / f"s{uuid.uuid4().hex}"
    session.mkdir()
    shutil.copy(three_chunks / "init.mp4", session / "init.mp4")
    sources = [three_chunks / f"chunk_{1 + i % 3}.m4s" for i in range(len(indexes))]
    for index, source in zip(indexes, sources, strict=True):
        shutil.copy(source, session / f"chunk_{index}.m4s")
    dest = tmp_path / f"{session.name}.mp4"
    ordered = sorted(zip(indexes, sources, strict=True))
    tracemalloc.start()
    try:
        with data_limit(256 << 20):
            report = assemble_recording(session, dest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    keys = [i for i, _ in ordered]
    assert report.missing_ranges == _gaps(keys)
    assert report.missing_count == sum(b - a + 1 for a, b in _gaps(keys))
    assert (report.first_index, report.last_index, report.chunks) == (keys[0], keys[-1], len(keys))
    assert dest.read_bytes() == (session / "init.mp4").read_bytes() + b"".join(s.read_bytes() for _, s in ordered)
