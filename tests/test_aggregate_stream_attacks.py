"""A hostile review of the streamed aggregate read (``core.json_stream``, ``run.aggregate_read``):
documents the stream must not read differently from the whole parse (bytes yajl lets through
that no strict JSON parser accepts, bytes that crash its UTF-8 decoding), and what a streamed
table must still redact.

Each case is compared with the whole read of the same file, forced (``stream=True`` /
``stream=False``) on a small document, so every test runs in well under a second.
"""

from __future__ import annotations

import contextlib
import copy
import glob
from pathlib import Path

import pytest

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.json_stream import NotStreamable, canonical_bytes
from gym_artifacts.core.jsonio import canonical_json, read_json
from gym_artifacts.run.aggregate_read import read_aggregate

# Bytes no strict JSON parser accepts but yajl (ijson's C backend) reads past: a form feed or a
# vertical tab as white space, and an unterminated string after the document (yajl waits for
# its end and takes the end of the file as "no more input").
NOT_JSON_BUT_YAJL_READS_IT = [
    b'[\x0c{"a": 1}]',
    b'\x0b[{"a": 1}]',
    b'[{"a": 1}]\x0c',
    b'[{"a": 1}] "',
    b'[{"a": 1}] "abc]',
    b'[{"a": 1}]\n"{\\"b\\": 2}',
]

# Bytes that are not UTF-8 inside a string: yajl passes them on, and ijson's decoding of them
# raises UnicodeDecodeError (neither NotStreamable nor RunError).
NOT_UTF8 = [
    b'[{"a": "x\xed\xa0\x80y"}]',  # an encoded surrogate
    b'[{"a": "x\xc0\x80y"}]',  # an overlong NUL
    b'[{"a": "x\xf4\x90\x80\x80y"}]',  # past U+10FFFF
    b'[{"k\xe0\x80\x80": 1}]',  # an overlong form in a key
    b'[{"group_level_metrics": [{"s": "\xed\xbf\xbf"}]}]',
]


def _whole_error(fpath: Path) -> str:
    with pytest.raises(RunError) as whole:
        read_aggregate(fpath, stream=False)
    return str(whole.value)


@pytest.mark.parametrize("data", NOT_JSON_BUT_YAJL_READS_IT + NOT_UTF8)
def test_what_the_whole_read_refuses_the_streamed_canonical_form_refuses_too(tmp_path: Path, data) -> None:
    fpath = tmp_path / "doc.json"
    fpath.write_bytes(data)
    with pytest.raises(RunError):
        read_json(fpath)
    with pytest.raises(NotStreamable):
        canonical_bytes(fpath)


@pytest.mark.parametrize("data", NOT_JSON_BUT_YAJL_READS_IT + NOT_UTF8)
def test_a_streamed_aggregate_refuses_what_the_whole_read_refuses_with_its_error(
    tmp_path: Path, data
) -> None:
    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_bytes(data)
    expected = _whole_error(fpath)
    with pytest.raises(RunError) as streamed:
        read_aggregate(fpath, stream=True)
    assert str(streamed.value) == expected


@pytest.mark.parametrize("data", [b'[{"a": 1}]\n', b"[]\r\n\t ", b'"abc"', b"12", b"true", b'{"a": "\\\\"}'])
def test_a_valid_document_s_trailing_white_space_and_top_level_scalars_still_stream(
    tmp_path: Path, data
) -> None:
    fpath = tmp_path / "doc.json"
    fpath.write_bytes(data)
    assert canonical_bytes(fpath) == canonical_json(read_json(fpath))


def test_a_refused_stream_leaves_no_spooled_rows_behind(tmp_path: Path) -> None:
    """Every spool of a refused stream is closed at once (spools are anonymous files: an open
    descriptor is all there is to leak)."""
    import gc
    import os

    from gym_artifacts.run import aggregate_read

    aggregate_read._CACHE.clear()
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for i, data in enumerate(
        NOT_JSON_BUT_YAJL_READS_IT + NOT_UTF8 + [b'[{"group_level_metrics": [1], "x": NaN}]']
    ):
        fpath = tmp_path / f"agg{i}.json"
        fpath.write_bytes(data)
        with contextlib.suppress(RunError):
            read_aggregate(fpath, stream=True)
    aggregate_read._CACHE.clear()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    assert not glob.glob(str(tmp_path / "gymart-level-*"))


KNOWN = "gymart-known-zq81x7-secret"


@pytest.mark.parametrize("stream", [False, True])
def test_a_secret_the_process_knows_is_redacted_from_level_tables_without_config_secrets(
    tmp_path: Path, stream: bool
) -> None:
    """``redact_secret_values`` redacts the process-wide known secrets (``remember_secrets``) as
    well as the config's: a level table sent for a run whose config holds none must still lose
    a known one, as before the tables were streamed."""
    from gym_artifacts.contract.run_payload import _redacted_table
    from gym_artifacts.core.secrets import remember_secrets

    remember_secrets({KNOWN})
    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_text('[{"group_level_metrics": [{"_ng_task_index": 0, "note": "key=' + KNOWN + '"}]}]')
    (table,) = read_aggregate(fpath, stream=stream).tables
    sent = _redacted_table(table, frozenset())
    cells = [c for row in sent.rows for c in row if isinstance(c, str)]
    assert cells and not any(KNOWN in c for c in cells)


def test_a_url_credential_in_a_level_cell_is_masked_in_tensorboard_s_table_file(
    quickstart_run: Path, tmp_path: Path
) -> None:
    """TensorBoard's attached level tables went through ``redact_text`` (credential shapes such
    as ``user:password@`` in a URL, and the known secrets) whatever the config's secrets; a
    table written a line at a time must mask the same, also for a config that holds none."""
    import json

    from omegaconf import OmegaConf

    from gym_artifacts import export_run
    from gym_artifacts.contract.hooks import ExportStatus

    password = "hunter2-level-pass"
    aggregate = quickstart_run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(aggregate.read_text())
    levelled = next(e for e in entries if isinstance(e.get("group_level_metrics"), list))
    levelled["group_level_metrics"][0]["endpoint"] = f"https://alice:{password}@models.example.com/v1"
    aggregate.write_text(json.dumps(entries))
    quickstart_run.with_name("eval_config.yaml").write_text("seed: 1\n")  # a config without secrets
    logdir = tmp_path / "tb"
    cfg = OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(logdir)}}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    [table] = logdir.rglob("tables/group_level_metrics.jsonl")
    text = table.read_text()
    assert "models.example.com" in text and password not in text


@pytest.mark.parametrize("stream", [False, True])
def test_an_aggregate_file_removed_while_it_is_read_gives_what_was_read_not_an_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The file goes (a cleanup, a rotation) between its read and the check that it did not
    change: the read is still returned (not kept for others), never a FileNotFoundError."""
    from gym_artifacts.core import json_stream
    from gym_artifacts.run import aggregate_read

    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_text('[{"agent_ref": "a", "group_level_metrics": [{"_ng_task_index": 0, "r": 1}]}]')
    real_events = json_stream.json_events
    real_entries = aggregate_read.read_entries

    def events_then_gone(path: Path, what: str = "JSON"):
        yield from real_events(path, what)
        path.unlink()

    def entries_then_gone(path: Path):
        try:
            return real_entries(path)
        finally:
            path.unlink()

    monkeypatch.setattr(json_stream, "json_events", events_then_gone)
    monkeypatch.setattr(aggregate_read, "read_entries", entries_then_gone)
    read = read_aggregate(fpath, stream=stream)
    assert read.heads == [{"agent_ref": "a"}]
    assert fpath not in aggregate_read._CACHE


def test_an_aggregate_streamed_where_no_temporary_file_can_be_made_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TMPDIR gone (or full): the spool cannot be written, and the read falls back to the whole
    parse (as before the stream existed) instead of an OSError out of every backend."""
    import tempfile

    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_text('[{"agent_ref": "a", "group_level_metrics": [{"_ng_task_index": 0, "r": 1}]}]')
    whole = read_aggregate(fpath, stream=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    streamed = read_aggregate(fpath, stream=True)
    assert streamed.heads == whole.heads
    assert [list(r) for t in streamed.tables for r in t.rows] == [
        list(r) for t in whole.tables for r in t.rows
    ]


def test_a_json_identity_streamed_where_no_temporary_file_can_be_made_is_the_whole_parse_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member past ``SPILL_BYTES`` waits in a temporary file: none can be made, and the
    identity is still the whole parse's (not an OSError)."""
    import tempfile

    from gym_artifacts.core import json_stream
    from gym_artifacts.run.identity import hash_json_file

    fpath = tmp_path / "doc.json"
    fpath.write_text('{"z": [' + ",".join(str(i) for i in range(200)) + '], "a": 1}')
    whole = hash_json_file(fpath)
    monkeypatch.setattr(json_stream, "SPILL_BYTES", 16)
    monkeypatch.setattr(json_stream, "STREAMED_JSON_MIN_BYTES", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    assert hash_json_file(fpath) == whole


@pytest.mark.parametrize("stream", [False, True])
def test_a_reader_that_edits_its_aggregate_read_does_not_change_the_next_reader_s(
    tmp_path: Path, stream: bool
) -> None:
    """Each export (and each ``payload.aggregate_entries``) used to get its own parse: a plugin
    that edits the entries or a table's rows in place must not change what the next export of
    the same unchanged file reads from the shared cache."""
    from gym_artifacts.run import aggregate_read

    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_text(
        '[{"agent_ref": "a", "agent_metrics": {"mean/reward": 0.5},'
        ' "repeat_level_metrics": [{"_ng_rollout_index": 0, "r": 1}]}]'
    )
    aggregate_read._CACHE.clear()
    first = read_aggregate(fpath, stream=stream)
    heads = copy.deepcopy(first.heads)
    rows = [list(r) for r in first.tables[0].rows]
    first.heads[0]["agent_metrics"]["mean/reward"] = 99.0
    first.heads.append({"agent_ref": "injected"})
    if isinstance(first.tables[0].rows, list):
        first.tables[0].rows[0][2] = "edited"
    again = read_aggregate(fpath)
    assert again.heads == heads
    assert [list(r) for r in again.tables[0].rows] == rows


@pytest.mark.parametrize("stream", [False, True])
def test_an_integer_past_python_s_digit_limit_is_a_run_error_not_a_value_error(
    tmp_path: Path, stream: bool
) -> None:
    """orjson refuses an integer of thousands of digits, the stdlib fallback raises ValueError
    (past ``sys.get_int_max_str_digits``) and yajl an overflow: the file is refused with a
    RunError by the whole read and the stream alike, and its identity too."""
    from gym_artifacts.run.identity import hash_json_file

    fpath = tmp_path / "aggregate_metrics.json"
    fpath.write_text('[{"group_level_metrics": [{"_ng_task_index": 0, "r": ' + "7" * 5000 + "}]}]")
    with pytest.raises(RunError, match="aggregate metrics JSON"):
        read_aggregate(fpath, stream=stream)
    with pytest.raises(RunError):
        hash_json_file(fpath)
