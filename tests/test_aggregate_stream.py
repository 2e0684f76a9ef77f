"""NeMo Gym's aggregate metrics file read as a stream: the same result as a whole parse for every
document, in memory that does not grow with the document (it holds every rollout's infos).

The stream is forced (``stream=True``) on small generated documents and compared with the whole
parse (``stream=False``); the memory tests read a document of tens of megabytes in a subprocess
and compare its peak with the whole parse's, in the same run.
"""

from __future__ import annotations

import gc
import json
import re
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.json_stream import NotStreamable, canonical_bytes
from gym_artifacts.core.jsonio import canonical_json, read_json
from gym_artifacts.run import aggregate_read
from gym_artifacts.run.aggregate_read import SpooledRows, read_aggregate
from gym_artifacts.run.identity import hash_json_file
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[1]

keys = st.text(max_size=6)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
scalars |= st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


def _write(tmp: Path, doc: object, *, indent: int | None, ascii_only: bool) -> Path:
    fpath = tmp / "doc.json"
    fpath.write_text(json.dumps(doc, indent=indent, ensure_ascii=ascii_only), encoding="utf-8")
    return fpath


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=values, indent=st.none() | st.integers(0, 3), ascii_only=st.booleans())
def test_the_streamed_canonical_form_is_the_whole_parse_s_bytes(
    tmp_path: Path, doc, indent, ascii_only
) -> None:
    fpath = _write(tmp_path, doc, indent=indent, ascii_only=ascii_only)
    try:
        streamed = canonical_bytes(fpath)
    except NotStreamable:  # a surrogate escape (an escaped emoji) or -2**63 (yajl's overflow)
        raw = fpath.read_bytes()
        assert re.search(rb"\\u[dD][89a-fA-F]", raw) or b"-9223372036854775808" in raw
        return
    assert streamed == canonical_json(read_json(fpath))


def test_a_spilled_member_keeps_its_place_among_sorted_keys(tmp_path: Path, monkeypatch) -> None:
    from gym_artifacts.core import json_stream

    monkeypatch.setattr(json_stream, "SPILL_BYTES", 64)  # every member past 64 bytes goes to disk
    doc = {"z": list(range(200)), "a": {"y": ["x" * 50] * 10, "b": 1}, "m": [{"k": i} for i in range(50)]}
    fpath = _write(tmp_path, doc, indent=2, ascii_only=False)
    assert canonical_bytes(fpath) == canonical_json(doc)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": NaN}',  # the stdlib's NaN: read whole, written as Python writes it
        "[123456789012345678901234567890]",  # past 64 bits
        '["\\ud800"]',  # a lone surrogate escape, kept escaped by the whole read
        '{"a": 1E400}',
    ],
)
def test_what_only_the_whole_read_accepts_is_not_streamed_and_keeps_its_identity(
    tmp_path: Path, text
) -> None:
    fpath = tmp_path / "odd.json"
    fpath.write_text(text)
    with pytest.raises(NotStreamable):
        canonical_bytes(fpath)
    from gym_artifacts.core import json_stream

    old = json_stream.STREAMED_JSON_MIN_BYTES
    json_stream.STREAMED_JSON_MIN_BYTES = 0
    try:
        streamed_identity = hash_json_file(fpath)
    finally:
        json_stream.STREAMED_JSON_MIN_BYTES = old
    assert streamed_identity == hash_json_file(fpath)


@pytest.mark.parametrize("text", ["[1] x", '{"a": [1, 2}', "", "[" * 300 + "]" * 300, '{"a": 1}{"b": 2}'])
def test_a_malformed_document_is_refused_by_the_stream(tmp_path: Path, text) -> None:
    fpath = tmp_path / "bad.json"
    fpath.write_text(text)
    with pytest.raises(NotStreamable):
        canonical_bytes(fpath)


# -- the aggregate file -----------------------------------------------------------------------------

items = st.dictionaries(keys, values, max_size=4).map(lambda d: {**d, "_ng_task_index": len(d)}) | values
entry_fields = st.fixed_dictionaries(
    {},
    optional={
        "agent_ref": st.fixed_dictionaries({"name": st.sampled_from(["a", "b", ""])}) | scalars,
        "agent_metrics": st.dictionaries(keys, scalars, max_size=4),
        "key_metrics": st.dictionaries(keys, scalars, max_size=3),
        "_ng_environment_server": st.text(max_size=5),
        "group_level_metrics": st.lists(
            items | st.fixed_dictionaries({"expected_num_rollouts": st.integers(0, 9) | st.text(max_size=2)}),
            max_size=5,
        )
        | items,
        "repeat_level_metrics": st.lists(items, max_size=3) | items,
        "aggregation_error": st.text(max_size=5),
    },
)


@st.composite
def aggregate_docs(draw) -> list:
    """Entries with their fields in any order (a level list before or after its agent_ref)."""
    entries = []
    for fields in draw(st.lists(entry_fields, max_size=4)):
        order = draw(st.permutations(sorted(fields)))
        entries.append({k: fields[k] for k in order})
    return entries


def _same(streamed, whole) -> None:
    assert streamed.heads == whole.heads
    assert streamed.expected_rollouts == whole.expected_rollouts
    assert [(t.name, t.index, t.columns) for t in streamed.tables] == [
        (t.name, t.index, t.columns) for t in whole.tables
    ]
    for a, b in zip(streamed.tables, whole.tables, strict=True):
        assert len(a.rows) == len(b.rows)
        assert list(a.rows) == list(b.rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=aggregate_docs(), indent=st.none() | st.just(2))
def test_the_streamed_aggregate_is_the_whole_read(tmp_path: Path, doc, indent) -> None:
    fpath = _write(tmp_path, doc, indent=indent, ascii_only=False)
    _same(read_aggregate(fpath, stream=True), read_aggregate(fpath, stream=False))


@pytest.mark.parametrize(
    "text",
    [
        # a repeated key: the last one wins, as in every whole parse here
        '[{"group_level_metrics": [{"_ng_task_index": 1}], "group_level_metrics": [{"_ng_task_index": 2}]}]',
        '[{"group_level_metrics": [{"_ng_task_index": 1}], "group_level_metrics": 3}]',
        '[{"group_level_metrics": 3, "group_level_metrics": [{"_ng_task_index": 2}]}]',
        '[{"agent_ref": {"name": "x"}, "agent_ref": "y", "group_level_metrics": [1, [2], {"a": NaN}]}]',
        '[{"group_level_metrics": [{"expected_num_rollouts": 1e400}]}]',
    ],
)
def test_repeated_keys_and_stdlib_numbers_give_the_whole_read(tmp_path: Path, text) -> None:
    fpath = tmp_path / "agg.json"
    fpath.write_text(text)
    _same(read_aggregate(fpath, stream=True), read_aggregate(fpath, stream=False))


@pytest.mark.parametrize("text", ['{"a": 1}', "[1]", "[{}] trailing", "[{}", "nope", ""])
def test_a_file_that_is_not_nemo_gym_s_format_is_refused_with_the_whole_read_s_error(
    tmp_path: Path, text
) -> None:
    fpath = tmp_path / "agg.json"
    fpath.write_text(text)
    with pytest.raises(RunError) as whole:
        read_aggregate(fpath, stream=False)
    with pytest.raises(RunError) as streamed:
        read_aggregate(fpath, stream=True)
    assert str(streamed.value) == str(whole.value)


def _big_aggregate(fpath: Path, tasks: int, repeats: int = 4) -> None:
    """An aggregate file shaped like NeMo Gym 0.7's (rollout_infos for every repeat of every task)."""
    info = {"reward": 1.0, "input_tokens": 81.0, "output_tokens": 16.0, "total_tokens": 97.0}
    groups = [
        {
            "_ng_task_index": t,
            "mean/reward": 0.5,
            "expected_num_rollouts": repeats,
            "rollout_infos": [{**info, "_ng_task_index": t, "_ng_rollout_index": r} for r in range(repeats)],
            "sample": {"agent_ref": {"name": "agent"}},
        }
        for t in range(tasks)
    ]
    doc = [
        {
            "agent_ref": {"name": "agent"},
            "agent_metrics": {"mean/reward": 0.5, "num_rollouts": tasks * repeats},
            "group_level_metrics": groups,
            "repeat_level_metrics": [{"_ng_rollout_index": r, "mean/reward": 0.5} for r in range(repeats)],
        }
    ]
    fpath.write_text(json.dumps(doc, indent=2))


def test_rows_read_back_by_two_threads_at_once_are_each_whole(tmp_path: Path) -> None:
    fpath = tmp_path / "agg.json"
    _big_aggregate(fpath, tasks=2000)
    read = read_aggregate(fpath, stream=True)
    [groups] = [t for t in read.tables if t.name == "group_level_metrics"]
    assert isinstance(groups.rows, SpooledRows)
    got: list[list] = [[], []]

    def reader(i: int) -> None:
        got[i] = [row[groups.columns.index("_ng_task_index")] for row in groups.rows]

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got[0] == got[1] == list(range(2000))
    assert read.expected_rollouts == 8000
    assert groups.rows[-1][groups.columns.index("_ng_task_index")] == 1999
    assert [r[1] for r in groups.rows[10:12]] == [10, 11]


def test_the_spooled_rows_go_with_the_last_reference(tmp_path: Path) -> None:
    import weakref

    fpath = tmp_path / "agg.json"
    _big_aggregate(fpath, tasks=50)
    read = read_aggregate(fpath, stream=True)
    spool = weakref.ref(read.tables[0].rows._spool)
    file = read.tables[0].rows._spool.file
    redacted = read.tables[0].rows.redacted(frozenset({"agent"}))
    aggregate_read._CACHE.clear()
    del read
    gc.collect()
    assert spool() is not None  # the redacted copy still reads it
    assert [row[0] for row in redacted] == ["***"] * 50
    del redacted
    gc.collect()
    assert spool() is None and file.closed


KILLED = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from gym_artifacts.run.aggregate_read import read_aggregate
read = read_aggregate(Path({fpath!r}), stream=True)
assert sum(len(t.rows) for t in read.tables) > 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_holding_spooled_rows_leaves_no_file_behind(tmp_path: Path) -> None:
    fpath = tmp_path / "agg.json"
    _big_aggregate(fpath, tasks=500)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    code = KILLED.format(repo=str(REPO), fpath=str(fpath))
    env = {**__import__("os").environ, "TMPDIR": str(private_tmp)}
    proc = run_bounded([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert list(private_tmp.iterdir()) == []


MEASURE = """
import json, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
from gym_artifacts.run.aggregate_read import read_aggregate
from gym_artifacts.run.identity import hash_json_file
from gym_artifacts.core import json_stream
import ijson, orjson
open("/proc/self/clear_refs", "w").write("5")
base = hwm()
mode = {mode!r}
if mode == "identity":
    json_stream.STREAMED_JSON_MIN_BYTES = 0
    hash_json_file(Path({fpath!r}))
elif mode == "identity-whole":
    json_stream.STREAMED_JSON_MIN_BYTES = 1 << 60
    hash_json_file(Path({fpath!r}))
elif mode == "mask":
    from gym_artifacts.run.sidecars import masked_values
    assert masked_values(Path({fpath!r}), frozenset({{"sk-not-in-the-file-0123"}})) is None
elif mode == "mask-whole":
    Path({fpath!r}).read_bytes().decode("utf-8", errors="surrogateescape")
else:
    read = read_aggregate(Path({fpath!r}), stream=(mode == "stream"))
    rows = sum(1 for t in read.tables for _ in t.rows)
print(json.dumps(hwm() - base))
"""


def _peak_mb(fpath: Path, mode: str) -> float:
    code = MEASURE.format(repo=str(REPO), fpath=str(fpath), mode=mode)
    out = run_bounded(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def test_reading_a_large_aggregate_takes_memory_that_does_not_grow_with_it(tmp_path: Path) -> None:
    """A 22 MB aggregate (what NeMo Gym writes for ~50,000 rollouts): the whole read's peak is
    several times the file; the streamed read's and the streamed identity's are a fraction of
    it, and a file 4x as large does not raise them much."""
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    _big_aggregate(small, tasks=5_000)
    _big_aggregate(large, tasks=20_000)
    size_mb = large.stat().st_size / 2**20
    assert size_mb > 20
    whole = _peak_mb(large, "whole")
    streamed_small, streamed = _peak_mb(small, "stream"), _peak_mb(large, "stream")
    identity_whole, identity = _peak_mb(large, "identity-whole"), _peak_mb(large, "identity")
    assert whole > 1.5 * size_mb  # what the whole parse costs: the attack, measured
    assert identity_whole > 1.5 * size_mb
    assert streamed < 0.25 * whole, (streamed, whole)
    assert identity < 0.25 * identity_whole, (identity, identity_whole)
    assert streamed < streamed_small + 0.1 * size_mb, (streamed_small, streamed)  # not growing with it
    # shipping it: looking for the config's secrets before copying it as it is
    assert _peak_mb(large, "mask") < 0.4 * _peak_mb(large, "mask-whole")


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=200),
    secret=st.text(min_size=4, max_size=12),
    at=st.integers(0, 200),
    block=st.integers(1, 40),
    present=st.booleans(),
)
def test_a_secret_is_found_wherever_it_lies_across_the_blocks_of_a_scan(data, secret, at, block, present) -> None:
    """The scan that spares reading a large file whole before shipping it: a secret's every
    encoded form, astride any block boundary, is found exactly when the whole read finds it."""
    import tempfile

    from gym_artifacts.core.secrets import file_holds_any, secret_forms_as_bytes

    forms = secret_forms_as_bytes({secret}, known=False)
    if forms is None:  # a lone surrogate: no byte form, the file is read whole
        return
    form = sorted(forms)[0]
    body = data[:at] + form + data[at:] if present else data
    with tempfile.NamedTemporaryFile() as fh:
        fh.write(body)
        fh.flush()
        assert file_holds_any(fh.name, forms, block=block) == any(f in body for f in forms)


def test_a_secret_in_a_large_aggregate_is_still_masked_when_it_is_shipped(tmp_path: Path) -> None:
    from gym_artifacts.run.sidecars import masked_values

    fpath = tmp_path / "agg.json"
    _big_aggregate(fpath, tasks=3000)
    secret = "sk-live-0123456789"
    text = fpath.read_text()
    fpath.write_text(text[: len(text) // 2] + json.dumps(secret)[1:-1] + text[len(text) // 2 :])
    masked = masked_values(fpath, frozenset({secret}))
    assert masked is not None and secret.encode() not in masked
    assert masked_values(fpath, frozenset({"sk-other-0000"})) is None


def test_a_run_exported_with_its_aggregate_streamed_lands_byte_for_byte_as_read_whole(
    tmp_path: Path, monkeypatch
) -> None:
    """The with-failures fixture exported twice to the local backend, its aggregate read whole
    then as a stream: the same tables, summary and content identities (old receipts stay valid)."""
    import shutil

    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from gym_artifacts.core import json_stream
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.identity import content_identities
    from tests.fixture_paths import NEMO_GYM_FIXTURES

    landed = {}
    for mode, threshold in (("whole", 1 << 60), ("stream", 0)):
        monkeypatch.setattr(json_stream, "STREAMED_JSON_MIN_BYTES", threshold)
        aggregate_read._CACHE.clear()
        run_dir = shutil.copytree(NEMO_GYM_FIXTURES / "with-failures", tmp_path / mode / "run")
        store = tmp_path / mode / "store"
        cfg = OmegaConf.create(
            {"exporters": {"local": {"enabled": True, "root": str(store), "report": "off"}}}
        )
        [result] = export_run(run_dir / "rollouts.jsonl", cfg)
        assert result.status.value == "EXPORTED", result.reason
        identities = content_identities(RunArtifacts.from_path(run_dir / "rollouts.jsonl"), use_cache=False)
        files = {
            p.relative_to(store).parts[-2:]: p.read_bytes()
            for p in store.rglob("*")
            if p.is_file() and (p.parent.name == "tables" or p.name == "summary.json")
        }
        landed[mode] = (identities, files)
    assert landed["stream"][0] == landed["whole"][0]
    assert set(landed["stream"][1]) == set(landed["whole"][1])
    assert ("tables", "group_level_metrics.jsonl") in landed["whole"][1]
    for name, data in landed["whole"][1].items():
        if name[-1] != "summary.json":
            assert landed["stream"][1][name] == data, name
    summaries = [
        json.loads(landed[m][1][next(k for k in landed[m][1] if k[-1] == "summary.json")]) for m in landed
    ]
    assert summaries[0] == summaries[1]


cells = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5) | st.floats()


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(st.text(max_size=4), min_size=1, max_size=4, unique=True), data=st.data())
def test_a_table_written_a_row_at_a_time_is_the_whole_table_s_json(columns, data) -> None:
    from gym_artifacts.core.jsonio import json_safe
    from gym_artifacts.run.levels import LevelTable, table_jsonl, table_split_json

    rows = data.draw(st.lists(st.lists(cells, min_size=len(columns), max_size=len(columns)), max_size=5))
    table = LevelTable("group_level_metrics", "_ng_task_index", columns, rows)
    assert table_split_json(table) == canonical_json(json_safe({"columns": columns, "data": rows}))
    assert table_jsonl(table) == b"".join(
        canonical_json(json_safe(dict(zip(columns, r, strict=True)))) + b"\n" for r in rows
    )
