"""Bad input, generated and hand-made: every malformed config, receipt, marker, aggregate metrics
file or rollout line ends in a clear error or a FAILED result with a reason; never a traceback,
never a partial send, never a changed run file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from gym_artifacts.cli import main
from gym_artifacts.contract import registry
from gym_artifacts.live import live_run
from gym_artifacts.run.artifacts import RunArtifacts
from tests.backends import CountingExporter
from tests.conftest import copy_quickstart

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
COUNTS: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _counting() -> Iterator[None]:
    registry.register(CountingExporter)
    CountingExporter.sends.clear()
    yield
    registry.unregister("counting")


def fingerprint(folder: Path) -> dict[str, str]:
    """The run's own files (our hidden identity cache and lock files are not run files)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock")
    }


def export_exit_code(run: Path, *extra: str) -> int:
    try:
        return main(["export", str(run), "-e", "counting", "--json", *extra])
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code or 0)


class Sandbox:
    """One pristine quickstart copy per generated example (hypothesis reuses the test's folder)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0

    def run(self) -> Path:
        self.n += 1
        folder = self.root / f"ex{self.n}"
        if folder.exists():
            shutil.rmtree(folder)
        return copy_quickstart(folder)


def assert_failed_cleanly(
    run: Path, before: dict[str, str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in (1, 2), (code, out, err)
    if code == 1:
        [result] = json.loads(out)
        assert result["status"] == "FAILED" and result["reason"]
    else:
        assert err.strip()
    assert CountingExporter.sends == []  # nothing sent
    assert fingerprint(run.parent) == before  # no run file changed


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.slow
@SETTINGS
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_generated_rollout_lines(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], raw: bytes
) -> None:
    run = Sandbox(tmp_path_factory.mktemp("rl")).run()
    lines = run.read_bytes().splitlines(keepends=True)
    CountingExporter.sends.clear()
    candidate = raw.replace(b"\n", b" ") + b"\n"
    assume(candidate.strip())  # a blank line is skipped, not bad input
    try:
        json.loads(candidate)
        assume(False)  # a valid JSON line: not bad input
    except (ValueError, UnicodeDecodeError):
        pass
    lines.insert(len(lines) // 2, candidate)
    run.write_bytes(b"".join(lines))
    run.with_name("eval_aggregate_metrics.json").touch()
    before = fingerprint(run.parent)
    COUNTS["rollout lines"] = COUNTS.get("rollout lines", 0) + 1
    assert_failed_cleanly(run, before, export_exit_code(run), capsys)


@pytest.mark.slow
@SETTINGS
@given(content=json_values | st.binary(max_size=200))
def test_generated_receipts(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], content: object
) -> None:
    CountingExporter.sends.clear()
    run = Sandbox(tmp_path_factory.mktemp("rc")).run()
    receipt = RunArtifacts.from_path(run).export_done_fpath("counting")
    if isinstance(content, bytes):
        receipt.write_bytes(content)
    else:
        receipt.write_text(json.dumps(content))
    before = fingerprint(run.parent)
    COUNTS["receipts"] = COUNTS.get("receipts", 0) + 1
    code = export_exit_code(run)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and code == 1
    [result] = json.loads(out)
    assert result["status"] == "FAILED" and str(receipt) in result["reason"]
    assert CountingExporter.sends == [] and fingerprint(run.parent) == before


@pytest.mark.slow
@SETTINGS
@given(content=json_values)
def test_generated_aggregate_metrics(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], content: object
) -> None:
    if (
        isinstance(content, list)
        and content
        and all(isinstance(e, dict) for e in content)
        and not any(e.get("aggregation_error") for e in content)
    ):
        assume(False)  # a well-formed aggregate: not bad input
    CountingExporter.sends.clear()
    run = Sandbox(tmp_path_factory.mktemp("ag")).run()
    run.with_name("eval_aggregate_metrics.json").write_text(json.dumps(content))
    before = fingerprint(run.parent)
    COUNTS["aggregate metrics"] = COUNTS.get("aggregate metrics", 0) + 1
    assert_failed_cleanly(run, before, export_exit_code(run), capsys)


yaml_text = st.text(alphabet=st.sampled_from(list("abc:{}[]-\n #'\"$%&*!|>,.0123456789")), max_size=120)


def expected_config_error(text: str) -> str:
    """What the CLI must say about ``text`` as ``-c`` config, decided by PyYAML and OmegaConf alone.

    None of these texts can enable a backend (their alphabet cannot spell one), so every one is a
    usage error: unreadable YAML, not a mapping, or a valid config that enables nothing.
    """
    import yaml
    from omegaconf import OmegaConf

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the loader the tool reads configs with
    try:  # (they disagree at the edges: "!" is '' to libyaml, None to the pure-Python parser)
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError:
        return "invalid YAML"
    if data is not None and not isinstance(data, dict):
        return f"a config must be a YAML mapping, not {type(data).__name__}"
    try:
        OmegaConf.create(data or {})
    except Exception:
        return "invalid config"
    if data:  # no key these texts can spell is one an export config takes
        return "unknown key"
    return "no exporter is enabled"


@pytest.mark.slow
@SETTINGS
@given(text=yaml_text)
@example(text="!")  # a non-specific tag alone: a str to libyaml, nothing to the pure-Python parser
def test_generated_configs(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    CountingExporter.sends.clear()
    folder = tmp_path_factory.mktemp("cf")
    run = Sandbox(folder).run()
    config = folder / "config.yaml"
    config.write_text(text)
    before = fingerprint(run.parent)
    COUNTS["configs"] = COUNTS.get("configs", 0) + 1
    code = main(["export", str(run), "-c", str(config), "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 2 and json.loads(out or "[]") == [], err  # no result: nothing was exported
    expected = expected_config_error(text)
    assert expected in err, (text, err)
    if expected != "no exporter is enabled":
        assert str(config) in err  # the message names the file
    assert fingerprint(run.parent) == before


# How the config's flag reads (YAML 1.1 scalars, then the validated model's bool): the spec, by hand.
FLAGS = {
    "true": True, "True": True, "yes": True, "on": True, "1": True, "'true'": True, "'yes'": True,
    "'1'": True, "'Y'": True, "' on '": True,
    "false": False, "no": False, "off": False, "0": False, "'false'": False, "'0'": False, "'n'": False,
    "perhaps": None, "2": None, "[]": None, "{}": None, "''": None, "'tru'": None, "-1": None,
}  # fmt: skip
extra_keys = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=8).map("x_".__add__), json_values, max_size=4)


@pytest.mark.slow
@settings(SETTINGS, max_examples=len(FLAGS))
@given(flag=st.sampled_from(sorted(FLAGS)), extra=extra_keys)
def test_generated_configs_enabling_a_backend(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], flag: str, extra: dict
) -> None:
    """A backend's ``enabled`` written every way (beside unknown keys or not): sent exactly once, not at
    all, or refused by name."""
    import yaml

    CountingExporter.sends.clear()
    folder = tmp_path_factory.mktemp("ce")
    run = Sandbox(folder).run()
    config = folder / "config.yaml"
    config.write_text((yaml.safe_dump(extra) if extra else "") + f"exporters:\n  counting:\n    enabled: {flag}\n")
    before = fingerprint(run.parent)
    COUNTS["configs enabling a backend"] = COUNTS.get("configs enabling a backend", 0) + 1
    code = main(["export", str(run), "-c", str(config), "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if extra:  # keys an export config does not take: refused by name, whatever the flag
        assert code == 2 and "unknown key 'x_" in err and CountingExporter.sends == [], err
    elif FLAGS[flag] is True:
        assert code == 0, err
        [result] = json.loads(out)
        assert result["status"] == "EXPORTED" and len(CountingExporter.sends) == 1
    elif FLAGS[flag] is False:
        assert code == 2 and "no exporter is enabled" in err and CountingExporter.sends == []
    else:
        assert code == 2 and "exporters.counting.enabled" in err and "is not a boolean" in err, err
        assert CountingExporter.sends == []
    run_files = {k: v for k, v in fingerprint(run.parent).items() if "_export_done" not in k}
    assert run_files == before


@pytest.mark.slow
@SETTINGS
@given(content=json_values | st.binary(max_size=100))
def test_generated_markers(tmp_path_factory: pytest.TempPathFactory, content: object) -> None:
    folder = tmp_path_factory.mktemp("mk")
    out = folder / "eval.jsonl"
    marker = RunArtifacts.from_path(out).run_id_marker_fpath("local")
    if isinstance(content, bytes):
        marker.write_bytes(content)
    else:
        marker.write_text(json.dumps(content))
    COUNTS["markers"] = COUNTS.get("markers", 0) + 1
    cfg = {"exporters": {"local": {"enabled": True, "root": str(folder / "store")}}, "resume": True}
    with live_run(cfg, out) as live:  # a marker that is not ours: a new run, never a crash
        live.export_metrics({"x": 1}, step=0)
    [report] = live.reports
    assert report.setup_error is None and report.lost == 0


def test_symlink_leaving_the_run(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "secret.txt").write_text("outside")
    (quickstart_run.with_name("eval_artifacts") / "leak.txt").symlink_to(tmp_path / "secret.txt")
    before = fingerprint(quickstart_run.parent)
    assert_failed_cleanly(quickstart_run, before, export_exit_code(quickstart_run), capsys)


def test_names_with_dot_dot(quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(quickstart_run), "-e", "../local"]) == 2
    assert "unknown exporter '../local'" in capsys.readouterr().err
    code = main(["export", str(quickstart_run), "-e", "local", "exporters.local.experiment=../../escape"])
    assert code == 2 and "plain folder name" in capsys.readouterr().err
    assert not (tmp_path.parent / "escape").exists()


def test_non_utf8_bytes(quickstart_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with open(quickstart_run, "ab") as fh:
        fh.write(b'{"text": "\xff\xfe broken"}\n')
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    before = fingerprint(quickstart_run.parent)
    assert_failed_cleanly(quickstart_run, before, export_exit_code(quickstart_run), capsys)
    config = quickstart_run.with_name("eval_config.yaml")
    config.write_bytes(b"a: \xff\n")
    assert main(["export", str(quickstart_run), "-c", str(config)]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err


@pytest.mark.slow
def test_a_2_gb_line(quickstart_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with open(quickstart_run, "ab") as fh:
        fh.write(b'{"huge": "')
        fh.truncate(quickstart_run.stat().st_size + (2 << 30))  # a sparse 2 GB line: no newline in sight
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    before = fingerprint_sizes(quickstart_run.parent)
    code = export_exit_code(quickstart_run)
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    [result] = json.loads(out)
    assert "eval.jsonl:301: line is longer than" in result["reason"]
    assert CountingExporter.sends == [] and fingerprint_sizes(quickstart_run.parent) == before


def fingerprint_sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def test_an_empty_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "empty.jsonl"
    run.touch()
    (tmp_path / "empty_aggregate_metrics.json").write_text("[]")
    assert export_exit_code(run) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert "holds no rollouts" in result["reason"] or "list no agent" in result["reason"]
    empty_folder = tmp_path / "experiment-empty"
    empty_folder.mkdir()
    assert export_exit_code(empty_folder) == 1
    assert "holds no files" in json.loads(capsys.readouterr().out)[0]["reason"]
    assert CountingExporter.sends == []
    assert os.listdir(empty_folder) == []
