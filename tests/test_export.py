"""export_run(): receipts decide SKIPPED and FAILED; nothing is sent on a mismatch or bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.core.atomic import atomic_writer
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities
from gym_artifacts.run.receipts import read_receipt
from tests.backends import CountingExporter, CrashingExporter, ExplodingExporter


@pytest.fixture(autouse=True)
def _test_backends() -> Iterator[None]:
    for cls in (CountingExporter, ExplodingExporter, CrashingExporter):
        registry.register(cls)
    CountingExporter.sends.clear()
    yield
    for cls in (CountingExporter, ExplodingExporter, CrashingExporter):
        registry.unregister(cls.name)


def cfg(**enabled: bool) -> object:
    return OmegaConf.create({"exporters": {n: {"enabled": v} for n, v in enabled.items()}})


def test_export_then_skip(quickstart_run: Path) -> None:
    [first] = export_run(quickstart_run, cfg(counting=True))
    assert first.status is ExportStatus.EXPORTED
    receipt = read_receipt(RunArtifacts.from_path(quickstart_run).export_done_fpath("counting"))
    assert receipt is not None and receipt.backend_run_id == first.backend_run_id
    assert receipt.identities == content_identities(RunArtifacts.from_path(quickstart_run))
    [second] = export_run(quickstart_run, cfg(counting=True))
    assert second.status is ExportStatus.SKIPPED
    assert second.backend_run_id == first.backend_run_id
    assert len(CountingExporter.sends) == 1


def test_skipped_never_builds_the_backend(quickstart_run: Path) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    export_run(run, cfg(counting=True))
    # Give the exploding backend the same valid receipt: a match must not build it.
    receipt = run.export_done_fpath("counting").read_text()
    run.export_done_fpath("exploding").write_text(receipt.replace('"counting"', '"exploding"'))
    [result] = export_run(run, cfg(exploding=True))
    assert result.status is ExportStatus.SKIPPED


def test_one_failure_never_stops_another(quickstart_run: Path) -> None:
    results = export_run(quickstart_run, cfg(crashing=True, counting=True))
    by_name = {r.exporter: r for r in results}
    assert by_name["crashing"].status is ExportStatus.FAILED
    assert "ZeroDivisionError" in (by_name["crashing"].reason or "")
    assert by_name["counting"].status is ExportStatus.EXPORTED
    run = RunArtifacts.from_path(quickstart_run)
    assert not run.export_done_fpath("crashing").exists()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "invalid receipt JSON"),
        ('{"version": 3, "exporter": "counting"}', "receipt version 3 is not 1 or 2"),
        ("[1, 2, 3]", "not a gym-artifacts receipt"),
        ('{"version": 1, "exporter": "counting", "identi', "invalid receipt JSON"),
        ('{"version": 1, "exporter": "counting"}', "invalid receipt"),
        (b"\xff\xfe\x00garbage", "not valid UTF-8"),
    ],
    ids=["non-json", "other-version", "not-an-object", "truncated", "missing-fields", "binary"],
)
def test_bad_receipts_fail_and_send_nothing(quickstart_run: Path, content: str | bytes, match: str) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    fpath = run.export_done_fpath("counting")
    if isinstance(content, bytes):
        fpath.write_bytes(content)
    else:
        fpath.write_text(content)
    before = fpath.read_bytes()
    [result] = export_run(run, cfg(counting=True))
    assert result.status is ExportStatus.FAILED
    assert match in (result.reason or "")
    assert str(fpath) in (result.reason or "")
    assert CountingExporter.sends == []
    assert fpath.read_bytes() == before


def test_mismatched_receipt_names_what_differs_and_how_to_reexport(quickstart_run: Path) -> None:
    run = RunArtifacts.from_path(quickstart_run)
    export_run(run, cfg(counting=True))
    rec = run.artifacts_dpath / "recording.mp4"
    rec.write_bytes(rec.read_bytes() + b"\0")
    [result] = export_run(run, cfg(counting=True))
    assert result.status is ExportStatus.FAILED
    assert "artifacts/recording.mp4 changed" in (result.reason or "")
    assert "rollouts.jsonl" not in (result.reason or "")
    assert f"delete {run.export_done_fpath('counting')}" in (result.reason or "")
    assert len(CountingExporter.sends) == 1
    # Deleting the receipt exports the changed run on purpose, under its new identity.
    run.export_done_fpath("counting").unlink()
    [again] = export_run(run, cfg(counting=True))
    assert again.status is ExportStatus.EXPORTED
    assert len(set(CountingExporter.sends)) == 2


def test_partial_aggregate_metrics_fail(quickstart_run: Path) -> None:
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    data = json.loads(agg.read_text())
    data[2] = {"agent_ref": data[2]["agent_ref"], "aggregation_error": "timeout in verifier"}
    agg.write_text(json.dumps(data))
    [result] = export_run(quickstart_run, cfg(counting=True))
    assert result.status is ExportStatus.FAILED
    assert "aggregation_error" in (result.reason or "")
    assert "calendar_simple_agent: timeout in verifier" in (result.reason or "")
    assert CountingExporter.sends == []
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("counting").exists()


def test_stale_aggregate_metrics_fail(quickstart_run: Path) -> None:
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    with open(quickstart_run, "ab") as fh:  # one more rollout after the aggregation
        fh.write(quickstart_run.read_bytes().splitlines(keepends=True)[0])
    st = quickstart_run.stat()
    os.utime(agg, ns=(st.st_atime_ns, st.st_mtime_ns - 10_000_000_000))
    [result] = export_run(quickstart_run, cfg(counting=True))
    assert result.status is ExportStatus.FAILED
    assert "aggregate metrics are stale" in (result.reason or "")
    assert CountingExporter.sends == []


def test_missing_files_fail_naming_them(quickstart_run: Path) -> None:
    quickstart_run.with_name("eval_aggregate_metrics.json").unlink()
    [result] = export_run(quickstart_run, cfg(counting=True))
    assert result.status is ExportStatus.FAILED
    assert "eval_aggregate_metrics.json is missing" in (result.reason or "")


def test_crash_inside_atomic_write_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "receipt.json"
    with pytest.raises(RuntimeError), atomic_writer(target) as fh:
        fh.write(b'{"version": 1')
        raise RuntimeError("crash")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_process_killed_before_receipt_leaves_no_receipt(quickstart_run: Path) -> None:
    """A real SIGKILL while the send runs: no receipt, and the retry exports normally."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from omegaconf import OmegaConf
        from gym_artifacts.contract import registry
        from gym_artifacts.contract.hooks import Sent
        from gym_artifacts.contract.exporter import Exporter
        from gym_artifacts import export_run

        class Dying(Exporter):
            name = "counting"
            def _export(self, run, plan):
                os.kill(os.getpid(), signal.SIGKILL)

        registry.register(Dying)
        export_run({str(quickstart_run)!r},
                   OmegaConf.create({{"exporters": {{"counting": {{"enabled": True}}}}}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    assert proc.returncode == -9
    run = RunArtifacts.from_path(quickstart_run)
    assert not run.export_done_fpath("counting").exists()
    assert not [p for p in quickstart_run.parent.iterdir() if p.name.startswith(".gymart-tmp")]
    [result] = export_run(run, cfg(counting=True))
    assert result.status is ExportStatus.EXPORTED


def test_explicit_names_select_exporters(quickstart_run: Path) -> None:
    results = export_run(quickstart_run, cfg(counting=False), exporters=["counting"])
    assert [r.status for r in results] == [ExportStatus.EXPORTED]


def test_unknown_exporter_lists_known(quickstart_run: Path) -> None:
    from gym_artifacts.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown exporter 'nope' \(known: .*counting.*local"):
        export_run(quickstart_run, cfg(counting=True), exporters=["nope"])
