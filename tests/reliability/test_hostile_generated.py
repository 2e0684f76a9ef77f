"""Generated hostile shapes (hypothesis): deep nesting, integers past 64 bits, NaN and infinity
mixtures, YAML alias chains, odd file types and odd artifact names. The next new shape of the
same kind is caught without a hand-written case: each ends in a clear error or a FAILED result
naming the file, never a traceback or an internal error, in bounded time."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.cli import main
from gym_artifacts.core.jsonio import MAX_YAML_VALUES, YamlTooLarge, load_yaml_text
from tests.load import scaled
from tests.reliability.test_bad_input import Sandbox, _counting, fingerprint  # noqa: F401 - fixture

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))

big_ints = st.integers(min_value=2**63, max_value=2**300) | st.integers(
    min_value=-(2**300), max_value=-(2**63) - 1
)
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308])
hostile_leaves = big_ints | odd_floats | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)


@st.composite
def deeply_nested(draw: st.DrawFn) -> object:
    """A leaf wrapped in lists and objects, past the 256-level limit."""
    value: object = draw(hostile_leaves)
    for kind in draw(st.lists(st.booleans(), min_size=260, max_size=1200)):
        value = [value] if kind else {"k": value}
    return value


def dumps(value: object) -> str:
    """JSON text of any depth (the stdlib encoder recurses): built from the inside out."""
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v) for k, v in value.items()) + "}"
    return json.dumps(value)


def dumps_deep(value: object) -> str:
    opened, closers = [], []
    while isinstance(value, list | dict):
        if isinstance(value, list):
            opened.append("[")
            closers.append("]")
            value = value[0]
        else:
            opened.append('{"k":')
            closers.append("}")
            value = value["k"]
    return "".join(opened) + json.dumps(value) + "".join(reversed(closers))


def export_code(run: Path, *extra: str) -> int:
    try:
        return main(["export", str(run), "-e", "counting", "--json", *extra])
    except SystemExit as exc:
        return int(exc.code or 0)


def assert_clean(code: int, capsys: pytest.CaptureFixture[str], names: str | None = None) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in out + err, (out + err)[-2000:]
    assert code in (0, 1, 2), code
    if code and names is not None:
        assert names in out + err, (names, (out + err)[-2000:])
    return out + err


@pytest.mark.slow
@SETTINGS
@given(
    metrics=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=6), hostile_leaves, min_size=1, max_size=6
    ),
    nested=st.none() | deeply_nested(),
)
def test_generated_hostile_aggregates(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    metrics: dict,
    nested: object,
) -> None:
    from tests.backends import CountingExporter

    CountingExporter.sends.clear()
    run = Sandbox(tmp_path_factory.mktemp("ha")).run()
    agg = run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(agg.read_text())
    entries[0]["key_metrics"] = {**metrics, **({} if nested is None else {"deep": "@DEEP@"})}
    text = json.dumps(entries)  # NaN/Infinity as Python writes them
    if nested is not None:
        text = text.replace('"@DEEP@"', dumps_deep(nested))
    agg.write_text(text)
    before = fingerprint(run.parent)
    started = time.monotonic()
    code = export_code(run)
    assert time.monotonic() - started < 60
    assert_clean(code, capsys, names=str(agg))
    if nested is not None and code == 0:
        pytest.fail("JSON nested past the limit was exported")
    after = {k: v for k, v in fingerprint(run.parent).items() if not k.endswith("_export_done.json")}
    assert after == before  # no run file changed (a receipt is written only when EXPORTED)


@st.composite
def alias_chains(draw: st.DrawFn) -> tuple[str, int]:
    """A YAML document of alias levels; returns it and how many values it expands to."""
    fanout = draw(st.integers(2, 12))
    levels = draw(st.integers(1, 9))
    lines = [f"l0: &l0 [{', '.join(['x'] * fanout)}]"]
    size = 1 + fanout
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
        size = 1 + fanout * size
    return "\n".join(lines) + "\n", size


@SETTINGS
@given(doc=alias_chains())
def test_generated_yaml_alias_chains(doc: tuple[str, int]) -> None:
    text, top = doc
    started = time.monotonic()
    try:
        load_yaml_text(text)
        refused = False
    except YamlTooLarge:
        refused = True
    assert time.monotonic() - started < scaled(2), "alias expansion was not bounded"
    if top > MAX_YAML_VALUES * 2:  # the document is larger than its last level alone
        assert refused


@SETTINGS
@given(doc=alias_chains())
def test_generated_alias_bombs_as_config(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], doc: tuple[str, int]
) -> None:
    text, top = doc
    if top <= MAX_YAML_VALUES * 2:
        return
    folder = tmp_path_factory.mktemp("ab")
    run = Sandbox(folder).run()
    config = folder / "bomb.yaml"
    config.write_text(text)
    started = time.monotonic()
    code = main(["export", str(run), "-c", str(config), "--json"])
    assert time.monotonic() - started < scaled(10)
    assert code == 2
    assert "alias" in assert_clean(code, capsys, names=str(config))


ODD_KINDS = ["fifo", "socket", "dir-as-file", "dangling-link", "link-out"]


@pytest.mark.slow
@settings(SETTINGS, max_examples=len(ODD_KINDS) * 3)
@given(kind=st.sampled_from(ODD_KINDS), which=st.sampled_from(["receipt", "aggregate", "artifact", "config"]))
def test_generated_odd_file_types(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], kind: str, which: str
) -> None:
    from gym_artifacts.run.artifacts import RunArtifacts
    from tests.backends import CountingExporter

    CountingExporter.sends.clear()
    folder = tmp_path_factory.mktemp("ot")
    run = Sandbox(folder).run()
    layout = RunArtifacts.from_path(run)
    fpath = {
        "receipt": layout.export_done_fpath("counting"),
        "aggregate": layout.aggregate_metrics_fpath,
        "artifact": layout.artifacts_dpath / "odd.json",
        "config": layout.config_fpath,
    }[which]
    fpath.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(fpath)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(fpath))
        sock.close()
    elif kind == "dir-as-file":
        fpath.mkdir()
    elif kind == "dangling-link":
        fpath.symlink_to(folder / "nowhere")
    else:
        (folder / "outside.json").write_text("{}")
        fpath.symlink_to(folder / "outside.json")
    started = time.monotonic()
    code = export_code(run)
    assert time.monotonic() - started < 60
    text = assert_clean(code, capsys)
    if code != 0:  # refused: naming the odd entry (accepted only where it is not read at all)
        assert fpath.name in text, text[-2000:]


odd_names = st.lists(
    st.sampled_from([*"ab%#?&+= ;'\"\n\t\x7fé☃", "%25", "%23", "%0A", "%2F"]), min_size=1, max_size=12
).map("".join)


@SETTINGS
@given(name=odd_names)
def test_generated_artifact_names_stored_exactly_or_refused(name: str) -> None:
    """A name the MLflow backend accepts survives the URL round trip a server makes, exactly."""
    from gym_artifacts._builtin_exporters.mlflow import check_artifact_name

    try:
        check_artifact_name(name)
    except ValueError as exc:
        assert repr(name) in str(exc)
        return
    assert unquote(quote(name, safe="")) == name  # what the server decodes is what was meant
    assert unquote(name) == name and "#" not in name and "?" not in name
    assert not any(ord(c) < 32 or ord(c) == 127 for c in name)
