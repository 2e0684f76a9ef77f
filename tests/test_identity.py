"""Content identities: stable under formatting, order, gzip time and location; sensitive to content."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.core.errors import RunError
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities, hash_jsonl_file, run_identity
from tests.conftest import copy_quickstart


def identities(rollouts: Path, *, use_cache: bool = False) -> dict[str, str]:
    """Every file hashed afresh by default: a cached digest would hide what the hash depends on
    (after a move the cache travels with the run, so nothing would be rehashed)."""
    return content_identities(RunArtifacts.from_path(rollouts), use_cache=use_cache)


def test_names_are_relative_to_the_run(quickstart_run: Path) -> None:
    ids = identities(quickstart_run)
    assert set(ids) == {
        "rollouts.jsonl",
        "aggregate_metrics.json",
        "config.yaml",
        "metrics.jsonl",
        "failures.jsonl",
        "materialized_inputs.jsonl",
        "artifacts/session_times.json",
        "artifacts/metrics_summary.json",
        "artifacts/profile.pt.trace.json.gz",
        "artifacts/recording.mp4",
    }
    assert all(v.startswith("b3:") and len(v) == 3 + 64 for v in ids.values())


def test_reformatting_json_keeps_identity(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    data = json.loads(agg.read_text())
    # keys in another order, other white space
    reordered = [dict(reversed(list(e.items()))) for e in data]
    agg.write_text(json.dumps(reordered, indent=7))
    assert identities(quickstart_run) == before


def test_reordering_and_reformatting_rollouts_keeps_identity(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    lines = quickstart_run.read_text().splitlines()
    random.Random(1).shuffle(lines)
    reformatted = [json.dumps(json.loads(line), indent=None, separators=(", ", " : ")) for line in lines]
    quickstart_run.write_text("\n".join(reformatted) + "\n\n")
    assert identities(quickstart_run) == before


def test_regzipping_trace_at_another_time_keeps_identity(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    trace = quickstart_run.with_name("eval_artifacts") / "profile.pt.trace.json.gz"
    payload = gzip.decompress(trace.read_bytes())
    trace.write_bytes(gzip.compress(payload, compresslevel=1, mtime=time.time() + 12345))
    assert trace.read_bytes() != gzip.compress(payload, mtime=0)
    assert identities(quickstart_run) == before


def test_moving_the_run_folder_keeps_identity(quickstart_run: Path, tmp_path: Path) -> None:
    before = identities(quickstart_run)
    moved = tmp_path / "elsewhere" / "deeper"
    shutil.move(str(quickstart_run.parent), moved)
    assert identities(moved / "eval.jsonl") == before


def _only_changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    assert before.keys() == after.keys()
    return {k for k in before if before[k] != after[k]}


def test_one_rollout_value_changes_only_rollouts(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    lines = quickstart_run.read_text().splitlines()
    row = json.loads(lines[137])
    row["reward"] = 1.0 - row["reward"]
    lines[137] = json.dumps(row)
    quickstart_run.write_text("\n".join(lines) + "\n")
    assert _only_changed(before, identities(quickstart_run)) == {"rollouts.jsonl"}


def test_one_metric_changes_only_aggregate(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    data = json.loads(agg.read_text())
    data[1]["key_metrics"]["mean/reward"] += 0.001
    agg.write_text(json.dumps(data))
    assert _only_changed(before, identities(quickstart_run)) == {"aggregate_metrics.json"}


def test_one_recording_byte_changes_only_recording(quickstart_run: Path) -> None:
    before = identities(quickstart_run)
    rec = quickstart_run.with_name("eval_artifacts") / "recording.mp4"
    data = bytearray(rec.read_bytes())
    data[len(data) // 2] ^= 0x01
    rec.write_bytes(bytes(data))
    assert _only_changed(before, identities(quickstart_run)) == {"artifacts/recording.mp4"}


def test_duplicate_rollout_counts(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n{"y": 2}\n')
    b.write_text('{"x": 1}\n{"y": 2}\n{"x": 1}\n')
    assert hash_jsonl_file(a) != hash_jsonl_file(b)
    b.write_text('{"y":2}\n\n{"x":1}')
    assert hash_jsonl_file(a) == hash_jsonl_file(b)


def test_run_identity_depends_on_every_artifact(quickstart_run: Path) -> None:
    ids = identities(quickstart_run)
    changed = dict(ids, **{"artifacts/recording.mp4": "b3:" + "0" * 64})
    assert run_identity(ids) == run_identity(dict(reversed(list(ids.items()))))
    assert run_identity(ids) != run_identity(changed)


def test_malformed_jsonl_names_file_and_line(quickstart_run: Path) -> None:
    lines = quickstart_run.read_text().splitlines()
    lines[41] = lines[41][:-5]
    quickstart_run.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunError, match=r"eval\.jsonl:42:"):
        identities(quickstart_run)


def test_malformed_json_names_file_and_line(quickstart_run: Path) -> None:
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    agg.write_text('[\n  {"agent_ref": "a",\n   "key_metrics": {,}\n  }\n]\n')
    with pytest.raises(RunError, match=r"eval_aggregate_metrics\.json:3:"):
        identities(quickstart_run)


def test_symlink_leaving_the_run_is_refused(quickstart_run: Path, tmp_path: Path) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not part of the run")
    (quickstart_run.with_name("eval_artifacts") / "leak.txt").symlink_to(secret)
    with pytest.raises(RunError, match="symlink leads outside the run folder"):
        identities(quickstart_run)


# Files opened by this process while a test records them (``sys.addaudithook`` sees every
# ``open``, whoever calls it; a hook cannot be removed, so it records only while a list is set).
_OPENED: list[list[str]] = []


def _record_opens(event: str, args: tuple) -> None:
    if event == "open" and _OPENED and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED[-1].append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)


@contextlib.contextmanager
def files_opened_in(folder: Path) -> Iterator[list[str]]:
    """The names of the files under ``folder`` this process opens inside the block (the identity
    cache and lock files beside the run, which are not the run's content, left out)."""
    opened: list[str] = []
    _OPENED.append(opened)
    names: list[str] = []
    try:
        yield names
    finally:
        _OPENED.remove(opened)
        inside = (Path(p) for p in opened if Path(p).is_relative_to(folder))
        names.extend(p.name for p in inside if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock"))


def test_unchanged_files_are_not_read_again(quickstart_run: Path) -> None:
    old = time.time() - 60
    for p in [quickstart_run, *quickstart_run.parent.rglob("*")]:
        if p.is_file():
            os.utime(p, (old, old))
    with files_opened_in(quickstart_run.parent) as first_reads:
        first = identities(quickstart_run, use_cache=True)
    assert RunArtifacts.from_path(quickstart_run).identity_cache_fpath.is_file()
    assert quickstart_run.name in first_reads  # the check sees the reads it is about
    with files_opened_in(quickstart_run.parent) as reads:
        assert identities(quickstart_run, use_cache=True) == first
    assert reads == []
    (quickstart_run.with_name("eval_artifacts") / "session_times.json").write_text('{"start": "changed"}')
    with files_opened_in(quickstart_run.parent) as reads:
        identities(quickstart_run, use_cache=True)
    assert sorted(set(reads)) == ["session_times.json"]  # only the changed file is read


def test_a_changed_file_is_always_rehashed(quickstart_run: Path) -> None:
    import os

    old = time.time() - 60
    rec = quickstart_run.with_name("eval_artifacts") / "recording.mp4"
    for p in [quickstart_run, *quickstart_run.parent.rglob("*")]:
        if p.is_file():
            os.utime(p, (old, old))
    first = identities(quickstart_run, use_cache=True)
    # Same size, same mtime restored: only ctime tells the rewrite apart.
    st = rec.stat()
    data = bytearray(rec.read_bytes())
    data[100] ^= 0xFF
    rec.write_bytes(bytes(data))
    os.utime(rec, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rec.stat().st_size == st.st_size and rec.stat().st_mtime_ns == st.st_mtime_ns
    second = identities(quickstart_run, use_cache=True)
    assert second["artifacts/recording.mp4"] != first["artifacts/recording.mp4"]
    assert {k for k in first if first[k] != second[k]} == {"artifacts/recording.mp4"}


def test_a_freshly_written_file_is_not_cached(quickstart_run: Path) -> None:
    identities(quickstart_run, use_cache=True)  # the copies were just written: within the racy window
    cache = json.loads(RunArtifacts.from_path(quickstart_run).identity_cache_fpath.read_text())
    assert "rollouts.jsonl" not in cache["entries"]


def test_identities_hashed_in_flight_equal_the_identities_hashed_before(
    quickstart_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an export hashes beside its send (worker processes for every JSONL file here, a
    threshold lowered to the fixture's size) is what it hashed before the send."""
    from gym_artifacts.run import identity

    run = RunArtifacts.from_path(quickstart_run)
    expected = identities(quickstart_run)
    monkeypatch.setattr(identity, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(identity, "_workers", lambda: 2)
    _, known = identity.send_key(run)
    # the recording's identity is its bytes, a JSONL file's its records: one read for both
    jsonl = {name for name in expected if name.endswith(".jsonl")}
    assert jsonl and set(known) == {"artifacts/recording.mp4", *jsonl}
    assert {name: known[name][1] for name in jsonl} == {name: expected[name] for name in jsonl}
    run.identity_cache_fpath.unlink()  # the JSONL files hashed in flight again
    in_flight = identity.IdentitiesInFlight(run, {"artifacts/recording.mp4": known["artifacts/recording.mp4"]})
    assert in_flight.result() == (expected, run_identity(expected))
    with open(quickstart_run, "a") as fh:
        fh.write("{not json\n")
    run.identity_cache_fpath.unlink()
    with pytest.raises(RunError, match=r"eval\.jsonl:301:"):  # the line, as when hashed in order
        identity.IdentitiesInFlight(run).result()


def test_the_send_key_follows_the_bytes_not_the_folder_nor_the_times(
    quickstart_run: Path, tmp_path: Path
) -> None:
    """The send key finds a backend run before its identity is known: the same bytes give the same
    key from a copy in another folder and after a touch; any byte changed gives another."""
    from gym_artifacts.run.identity import send_key

    run = RunArtifacts.from_path(quickstart_run)
    key, _ = send_key(run)
    copy = tmp_path / "copy"
    shutil.copytree(quickstart_run.parent, copy)
    assert send_key(RunArtifacts.from_path(copy / quickstart_run.name))[0] == key
    for fpath in run.artifact_files().values():
        fpath.touch()
    assert send_key(run)[0] == key
    with open(quickstart_run, "ab") as fh:
        fh.write(b"\n")  # a blank line: the same identity, other bytes
    assert send_key(run)[0] != key


@given(
    st.lists(st.sampled_from([b"a", b"{}", b" ", b"\t", b"\r", b"\n", b"\n\n", b"\x0b", b"\x0c"]), max_size=80),
    st.integers(1, 16),
)
def test_lines_counted_from_the_send_keys_read_are_count_lines(
    tmp_path_factory: pytest.TempPathFactory, parts: list[bytes], chunk: int
) -> None:
    """The record count a cold export takes from the send key's read (``LineCounter``, fed in
    chunks) is ``count_lines``'s, whatever the chunks cut: blank lines, white space, no newline."""
    from gym_artifacts.core.jsonio import count_lines
    from gym_artifacts.run.identity import LineCounter

    data = b"".join(parts)
    fpath = tmp_path_factory.mktemp("lines") / "x.jsonl"
    fpath.write_bytes(data)
    counter = LineCounter()
    for i in range(0, len(data), chunk):
        counter.feed(data[i : i + chunk])
    assert counter.count == count_lines(fpath)


def _bytes_read() -> int:
    """Bytes this process has read through read(2) and friends so far (/proc/self/io rchar)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


NOW_S = int(time.time())


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mtime_s=st.one_of(
        st.integers(NOW_S + 2, NOW_S + 100 * 365 * 86400),  # a clock ahead: minutes to a century
        st.integers(NOW_S - 10, NOW_S + 10),  # about now
        st.integers(0, NOW_S - 10),  # the past, the epoch included
    ),
    offset_ns=st.integers(0, 999_999_999),
)
def test_a_file_from_the_future_is_hashed_once_not_once_per_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mtime_s: int, offset_ns: int
) -> None:
    """Files whose modification times lie anywhere (a century ahead, a clock 2 s fast, the
    epoch) are hashed once: the next two hashings of the unchanged run read only the cache."""
    import os

    from gym_artifacts.run.identity import IdentityCache

    monkeypatch.setattr(IdentityCache, "RACY_NS", 200_000_000)  # the window, shortened for the test
    rollouts = copy_quickstart(tmp_path / uuid.uuid4().hex)
    files = [p for p in rollouts.parent.rglob("*") if p.is_file()]
    mtime_ns = mtime_s * 1_000_000_000 + offset_ns
    for p in files:
        os.utime(p, ns=(mtime_ns, mtime_ns))
    time.sleep(0.3)  # past the (shortened) racy window since the files last changed
    size = sum(p.stat().st_size for p in files)
    first = identities(rollouts, use_cache=True)
    before = _bytes_read()
    for _ in range(2):
        assert identities(rollouts, use_cache=True) == first
    read = _bytes_read() - before
    cache = RunArtifacts.from_path(rollouts).identity_cache_fpath.stat().st_size
    assert read <= 2 * cache + 64 * 1024 < size, (read, cache, size)
