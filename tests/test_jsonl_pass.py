"""The one read of a JSONL file (``run.jsonl_pass``) gives what the separate passes gave.

Its bytes digest and line count are the send key's (``hash_bytes_file`` + ``LineCounter``), its
records' digest the identity's (``jsonl_digest``, a torn end left out), its params
``params_from_files``'s; in this process or from forked workers, whatever the lines' lengths
against the block, blank lines, an unterminated last line. A line longer than a block is left to
the separate passes; a malformed one is named by its line number.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.core.errors import RunError
from gym_artifacts.run import jsonl_pass, times
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import LineCounter, hash_bytes_file, jsonl_digest
from gym_artifacts.run.jsonl_pass import LineTooLong, read_jsonl_once
from gym_artifacts.run.nemo_gym_params import params_from_files
from gym_artifacts.run.rollouts_facts import cached_facts, run_params
from gym_artifacts.run.torn import partial_last_line

_rows = st.fixed_dictionaries(
    {
        "agent_ref": st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "é"])}),
        "_ng_task_index": st.integers(0, 5),
        "response": st.fixed_dictionaries({"model": st.sampled_from(["m1", "m2"])}),
        "reward": st.floats(allow_nan=False, allow_infinity=False),
        "text": st.text(max_size=300),
        "timestamp": st.one_of(st.none(), st.floats(1e9, 2e9)),
        "latency_s": st.one_of(st.none(), st.floats(0, 100)),
    }
)
_lines = st.lists(
    st.one_of(_rows.map(lambda r: json.dumps(r, ensure_ascii=False).encode()), st.sampled_from([b"", b"  "])),
    max_size=60,
)


def _write(tmp: Path, lines: list[bytes], last_newline: bool, torn: bool) -> Path:
    fpath = tmp / "OUT.jsonl"
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    if torn:
        data = (data if data.endswith(b"\n") or not data else data + b"\n") + b'{"cut": "hal'
    fpath.write_bytes(data)
    return fpath


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=_lines, last_newline=st.booleans(), torn=st.booleans(), block=st.sampled_from([512, 4096, 1 << 20]),
       parallel=st.booleans())  # fmt: skip
def test_one_read_gives_what_the_separate_passes_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[bytes], last_newline: bool, torn: bool,
    block: int, parallel: bool,
) -> None:  # fmt: skip
    monkeypatch.setattr(jsonl_pass, "BLOCK", block)
    fpath = _write(tmp_path, lines, last_newline, torn)
    cut = partial_last_line(fpath)
    end = cut.complete_bytes if cut else None
    counter = LineCounter()
    expected_bytes = hash_bytes_file(fpath, counter)
    try:
        read = read_jsonl_once(fpath, end, tally=True, parallel=parallel)
    except LineTooLong:
        assert max((len(line) for line in fpath.read_bytes().split(b"\n")), default=0) >= block - 1
        return
    assert read.bytes_digest == expected_bytes
    assert read.lines == counter.count
    expected = jsonl_digest(fpath, end=end)
    assert (read.records.count, read.records.hexdigest()) == (expected.count, expected.hexdigest())
    assert read.facts is not None
    assert read.facts.params.params() == params_from_files(RunArtifacts.from_path(fpath))
    assert read.facts.as_json()["window"] == _window_read_apart(fpath)


def _window_read_apart(fpath: Path) -> list[float] | None:
    """The rollouts' time window as ``times`` reads it without the one read."""
    times._ROLLOUT_TIMES.clear()
    found = times._rollouts(RunArtifacts.from_path(fpath))  # no identity cache here: read
    return None if found is None else [found.start, found.end]


def test_a_malformed_line_is_named(tmp_path: Path) -> None:
    from gym_artifacts.run.identity import send_key

    fpath = tmp_path / "OUT.jsonl"
    fpath.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": \n{"a": 3}\n')
    with pytest.raises(RunError, match=r"OUT.jsonl:3"):
        send_key(RunArtifacts.from_path(fpath))


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="reads are counted by Linux's /proc")
@pytest.mark.parametrize("recent", [False, True], ids=["in-the-identity-cache", "too-new-for-the-cache"])
def test_the_params_come_from_the_send_key_s_read(tmp_path: Path, recent: bool) -> None:
    """After the send key's read, the params and times of the unchanged rollouts are read from nothing (the
    identity cache, or this process's memory for a file inside the cache's racy window); a
    changed file is read again."""
    from gym_artifacts.run.identity import send_key

    fpath = tmp_path / "OUT.jsonl"
    rows = [{"agent_ref": {"name": "ag"}, "_ng_task_index": i // 3, "pad": "x" * 5000, "timestamp": 1.7e9 + i,
             "latency_s": 2.5} for i in range(300)]  # fmt: skip
    fpath.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if not recent:
        old = fpath.stat().st_mtime - 120
        os.utime(fpath, (old, old))
    run = RunArtifacts.from_path(fpath)
    send_key(run)
    before = _rchar()
    params = run_params(run)
    assert _rchar() - before < 100_000
    assert params == params_from_files(run) == {"agent_name": "ag", "num_repeats": 3}
    times._ROLLOUT_TIMES.clear()
    before = _rchar()
    assert times.run_times(run) == times.RunTimes(1.7e9, 1.7e9 + 299 + 2.5, "rollouts")
    assert _rchar() - before < 100_000
    assert cached_facts(run) is not None
    with open(fpath, "a") as fh:
        fh.write(json.dumps({"agent_ref": {"name": "ag"}, "_ng_task_index": 0}) + "\n")
    assert cached_facts(run) is None
    assert run_params(run) == {"agent_name": "ag", "num_repeats": 4}


def test_a_line_longer_than_a_block_is_read_by_the_separate_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line past the block (here 4 KiB) leaves the file to the separate passes: the same send
    key, identities and params as with the one read."""
    from gym_artifacts.run.identity import content_identities, send_key

    fpath = tmp_path / "OUT.jsonl"
    rows = [{"agent_ref": {"name": "ag"}, "_ng_task_index": i, "pad": "x" * (100 if i % 2 else 9000)} for i in range(20)]
    fpath.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = RunArtifacts.from_path(fpath)
    key, _ = send_key(run)
    expected = content_identities(run, use_cache=False), run_params(run)
    run.identity_cache_fpath.unlink()
    monkeypatch.setattr(jsonl_pass, "BLOCK", 4096)
    jsonl_pass._LAST_FACTS.clear()
    again, known_again = send_key(run)
    assert again == key and "OUT.jsonl" not in known_again
    assert cached_facts(run) is None
    assert (content_identities(run, known=known_again), run_params(run)) == expected


@pytest.mark.slow
def test_two_runs_exported_to_tensorboard_at_once_in_threads(tmp_path: Path, make_run: Any) -> None:
    """Each export keeps the rows' values of its own rollouts until it ends: another run's export
    in another thread of the process neither takes nor closes them."""
    import threading

    from omegaconf import OmegaConf

    from gym_artifacts import export_run

    outs = []
    for name in ("a", "b"):
        fpath = make_run(name)  # the quickstart run (its aggregate metrics), rollouts replaced
        reward = 0.25 if name == "a" else 0.75
        fpath.write_text("".join(json.dumps({"reward": reward, "i": i, "pad": "x" * 3000}) + "\n" for i in range(400)))
        old = fpath.stat().st_mtime - 120  # older than the aggregate metrics, as a finished run's
        os.utime(fpath, (old, old))
        outs.append(fpath)
    results: dict[str, list] = {}
    barrier = threading.Barrier(2, timeout=60)

    def export(fpath: Path) -> None:
        cfg = {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb" / fpath.stem), "table_rows": 3}}
        barrier.wait()
        results[fpath.stem] = export_run(fpath, OmegaConf.create({"exporters": cfg}))

    from gym_artifacts._builtin_exporters import tensorboard

    both_read = threading.Barrier(2, timeout=60)
    own = tensorboard.rollout_row_values

    given: list[bool] = []

    def after_both_reads(run: Any) -> Any:  # each TensorBoard export asks once both runs were read
        both_read.wait()
        values = own(run)
        given.append(values is not None)
        return values

    threads = [threading.Thread(target=export, args=(f,)) for f in outs]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tensorboard, "rollout_row_values", after_both_reads)
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
            assert not t.is_alive()
    assert given == [True, True]  # neither export lost its rows' values to the other
    for name, reward in (("a", 0.25), ("b", 0.75)):
        [result] = results[name]
        assert result.status.value == "EXPORTED", result.reason
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path / "tb" / name / result.backend_run_id))
        acc.Reload()
        values = [e.value for e in acc.Scalars("rollout/reward")]
        assert len(values) == 400 and set(values) == {reward}
