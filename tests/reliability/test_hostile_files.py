"""Hostile files, run through the real CLI in a subprocess: every one ends in a clear error or a
FAILED result with a reason naming the file, within a time bound (a hang fails the test), in
bounded memory (peak RSS measured), with no traceback, nothing sent and no run file changed; with
``--jobs 2`` the good run's result is still printed."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import copy_quickstart
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded
from tests.reliability.test_bad_input import fingerprint

REPO = Path(__file__).resolve().parents[2]
# Runs the CLI and writes its own peak RSS (KiB) to $RSS_OUT when it exits, however it exits.
# VmHWM, not ru_maxrss: Linux carries the forking parent's peak into ru_maxrss across exec, so
# inside a long pytest session every child would report the session's peak.
_CLI = (
    "import atexit, os, re, sys\n"
    "atexit.register(lambda: open(os.environ['RSS_OUT'], 'w').write("
    "re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))\n"
    "from gym_artifacts.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
RSS_LIMIT_MB = 400  # an import of the CLI with orjson, omegaconf and pydantic is ~100 MB


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    rss_mb: float

    @property
    def text(self) -> str:
        return self.out + self.err


def cli(tmp_path: Path, *args: str, timeout: float = 120) -> Outcome:
    rss = tmp_path / f"rss-{os.getpid()}-{len(list(tmp_path.glob('rss-*')))}"
    env = {**os.environ, "RSS_OUT": str(rss)}
    proc = run_bounded(
        [sys.executable, "-c", _CLI, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )  # a hang raises TimeoutExpired: the test fails, CI does not block
    rss_mb = int(rss.read_text()) / 1024 if rss.exists() else 0.0
    return Outcome(proc.returncode, proc.stdout, proc.stderr, rss_mb)


def local_args(tmp_path: Path) -> list[str]:
    return ["-e", "local", f"exporters.local.root={tmp_path / 'store'}", "--json"]


def assert_refused(outcome: Outcome, *, names: str, store: Path | None = None) -> None:
    assert "Traceback" not in outcome.text, outcome.text[-3000:]
    assert "internal error" not in outcome.text, outcome.text[-3000:]
    assert outcome.code in (1, 2), (outcome.code, outcome.text[-3000:])
    assert names in outcome.text, (names, outcome.text[-3000:])
    assert outcome.rss_mb < RSS_LIMIT_MB, outcome.rss_mb
    if store is not None:
        assert not store.exists() or not any(p.is_file() for p in store.rglob("*")), "something was sent"


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


DEPTH = 100_000


@pytest.mark.slow
@pytest.mark.parametrize("where", ["rollouts", "aggregate", "journal"])
def test_json_nested_too_deep(tmp_path: Path, where: str) -> None:
    run = copy_quickstart(tmp_path / "bad")
    good = copy_quickstart(tmp_path / "good")
    if where == "rollouts":
        with open(run, "a") as fh:
            fh.write('{"deep": ' + deep(DEPTH) + "}\n")
        target, line = run, ":301"
    elif where == "aggregate":
        target, line = run.with_name("eval_aggregate_metrics.json"), ""
        target.write_text(deep(DEPTH))
    else:
        target, line = run.with_name("eval_metrics.jsonl"), ":1"
        target.write_text('{"step": 0, "time": 1.0, "metrics": {"x": ' + deep(DEPTH) + "}}\n")
    before = fingerprint(run.parent)
    exported = cli(tmp_path, "export", str(run), *local_args(tmp_path))
    assert_refused(exported, names=f"{target}{line}", store=tmp_path / "store")
    assert "nested" in exported.text
    for command in (["status", str(run)], ["report", str(run), "-o", str(tmp_path / "report.html")]):
        outcome = cli(tmp_path, *command)
        assert "Traceback" not in outcome.text and "RecursionError" not in outcome.text, outcome.text[-2000:]
        assert outcome.rss_mb < RSS_LIMIT_MB
    assert fingerprint(run.parent) == before
    both = cli(tmp_path, "export", str(good), str(run), "--jobs", "2", *local_args(tmp_path))
    assert "Traceback" not in both.text and both.code == 1, both.text[-3000:]
    results = json.loads(both.out)
    by_run = {Path(r["run"]).parent.name: r["status"] for r in results}
    assert by_run == {"good": "EXPORTED", "bad": "FAILED"}, results


@pytest.mark.slow
def test_nan_and_integers_past_64_bits_in_aggregates(tmp_path: Path) -> None:
    run = copy_quickstart(tmp_path / "r")
    agg = run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(agg.read_text())
    entries[0].setdefault("key_metrics", {}).update({"nan": float("nan"), "huge": 2**70, "big": 2**64})
    agg.write_text(json.dumps(entries))
    outcome = cli(tmp_path, "export", str(run), *local_args(tmp_path))
    assert "Traceback" not in outcome.text and "internal error" not in outcome.text, outcome.text[-3000:]
    [result] = json.loads(outcome.out)
    assert result["status"] in ("EXPORTED", "FAILED"), result
    for run_json in (tmp_path / "store").rglob("run.json"):
        assert json.loads(run_json.read_text()).get("status") != "RUNNING", run_json.read_text()
    if result["status"] == "FAILED":
        assert "eval_aggregate_metrics.json" in result["reason"]
        return
    stored = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert str(2**64).encode() in stored and str(2**70).encode() in stored  # exactly, not a float
    assert b"1.8446744073709552e+19" not in stored


@pytest.mark.slow
def test_nan_and_integers_past_64_bits_in_aggregates_to_mlflow(tmp_path: Path) -> None:
    """MLflow metrics are floats: an integer past float precision is logged as a metric (to plot)
    and also as a tag of the same name holding its exact digits, never only as a rounded float."""
    pytest.importorskip("mlflow")
    run = copy_quickstart(tmp_path / "r")
    agg = run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(agg.read_text())
    entries[0].setdefault("key_metrics", {}).update(
        {"nan": float("nan"), "huge": 2**70, "big": 2**64, "small": 7}
    )
    agg.write_text(json.dumps(entries))
    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    outcome = cli(
        tmp_path, "export", str(run), "-e", "mlflow", f"exporters.mlflow.tracking_uri={uri}", "--json"
    )
    assert "Traceback" not in outcome.text and "internal error" not in outcome.text, outcome.text[-3000:]
    [result] = json.loads(outcome.out)
    assert result["status"] == "EXPORTED", result
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    data = client.get_run(result["backend_run_id"]).data
    # the headline is the run's metrics; every other statistic is a row of tables/metrics.json
    table = json.loads(
        Path(client.download_artifacts(result["backend_run_id"], "tables/metrics.json", str(tmp_path))).read_text()
    )
    data.metrics.update({metric: value for metric, value in table["data"]})

    def named(mapping: dict[str, object], leaf: str) -> dict[str, object]:
        return {k: v for k, v in mapping.items() if k.endswith(leaf)}

    for leaf, number in (("/huge", 2**70), ("/big", 2**64)):
        assert named(data.metrics, leaf) and all(
            v == float(number) for v in named(data.metrics, leaf).values()
        )
        assert named(data.metrics, leaf).keys() == named(data.tags, leaf).keys(), (data.metrics, data.tags)
        assert set(named(data.tags, leaf).values()) == {str(number)}, data.tags  # the exact digits
    assert named(data.metrics, "/small") and not named(data.tags, "/small")  # an exact float: a metric only


BILLION_LAUGHS = "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
    f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n"
    for i in range(9)
)


@pytest.mark.parametrize("where", ["-c", "run config"])
def test_billion_laughs_yaml(tmp_path: Path, where: str) -> None:
    run = copy_quickstart(tmp_path / "r")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    if where == "-c":
        outcome = cli(tmp_path, "export", str(run), "-c", str(bomb), "--json", timeout=60)
        names = str(bomb)
    else:
        config = run.with_name("eval_config.yaml")
        config.write_text(BILLION_LAUGHS)
        outcome = cli(tmp_path, "export", str(run), *local_args(tmp_path), timeout=60)
        names = str(config)
    assert_refused(outcome, names=names, store=tmp_path / "store")
    assert "alias" in outcome.text


def test_artifacts_folder_itself_a_symlink_leaving_the_run(tmp_path: Path) -> None:
    run = copy_quickstart(tmp_path / "r")
    artifacts = run.with_name("eval_artifacts")
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE KEY canary-id-rsa")
    for p in artifacts.iterdir():
        p.rename(outside / p.name)
    artifacts.rmdir()
    artifacts.symlink_to(outside, target_is_directory=True)
    outcome = cli(tmp_path, "export", str(run), *local_args(tmp_path))
    assert_refused(outcome, names=str(artifacts), store=tmp_path / "store")
    assert "outside the run" in outcome.text


@pytest.mark.slow
@pytest.mark.parametrize("which", ["receipt", "identity cache", "aggregate"])
def test_fifo_named_like_a_run_file_never_blocks(tmp_path: Path, which: str) -> None:
    from gym_artifacts.run.artifacts import RunArtifacts

    run = copy_quickstart(tmp_path / "r")
    layout = RunArtifacts.from_path(run)
    fpath = {
        "receipt": layout.export_done_fpath("local"),
        "identity cache": layout.identity_cache_fpath,
        "aggregate": layout.aggregate_metrics_fpath,
    }[which]
    fpath.unlink(missing_ok=True)
    os.mkfifo(fpath)
    exported = cli(tmp_path, "export", str(run), *local_args(tmp_path), timeout=60)
    status = cli(tmp_path, "status", str(run), timeout=60)
    assert "Traceback" not in exported.text + status.text, (exported.text + status.text)[-3000:]
    if which == "identity cache":  # only a cache: ignored (and replaced by a regular file)
        assert exported.code == 0, exported.text[-2000:]
    else:
        assert_refused(exported, names=str(fpath), store=tmp_path / "store")
        assert "not a regular file" in exported.text or "is missing" in exported.text


@pytest.mark.slow
def test_item_with_equals_meant_as_a_path(tmp_path: Path) -> None:
    run = copy_quickstart(tmp_path / "lr=0.1")
    outcome = cli(tmp_path, "export", str(run), *local_args(tmp_path))
    assert outcome.code == 0, outcome.text[-2000:]
    missing = cli(tmp_path, "export", str(tmp_path / "lr=0.2" / "eval.jsonl"), *local_args(tmp_path))
    assert missing.code in (1, 2) and "override" not in missing.text, missing.text
    assert "lr=0.2" in missing.text


def test_big_json_runtime_artifact_hashed_in_bounded_memory(tmp_path: Path) -> None:
    run = copy_quickstart(tmp_path / "r")
    big = run.with_name("eval_artifacts") / "big.json"
    row = json.dumps({"text": "x" * 1000, "n": 1}) + ","
    with open(big, "w") as fh:  # ~300 MB of one JSON array
        fh.write("[")
        chunk = row * 1000
        for _ in range(300):
            fh.write(chunk)
        fh.write('{"n": 0}]')
    outcome = cli(tmp_path, "status", str(run), timeout=300)
    assert outcome.code == 0 and "Traceback" not in outcome.text, outcome.text[-2000:]
    assert outcome.rss_mb < RSS_LIMIT_MB, outcome.rss_mb


def test_a_rollouts_file_that_is_a_fifo_is_named_so(tmp_path: Path) -> None:
    """A FIFO where the rollouts belong is refused at once, saying it is not a regular file (not
    "missing"), exit 1, no traceback; nothing is read from it (no hang). (A folder given as the
    run is a reactor-style artifacts folder, another form of run.)"""
    rollouts = copy_quickstart(tmp_path / "runs")
    rollouts.unlink()
    os.mkfifo(rollouts)
    cmd = [sys.executable, "-m", "gym_artifacts", "export", str(rollouts), "-e", "local",
           f"exporters.local.root={tmp_path / 'store'}"]  # fmt: skip
    proc = run_bounded(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is not a regular file" in proc.stdout + proc.stderr and "missing" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
