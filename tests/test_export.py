"""export_run(): receipts decide SKIPPED and FAILED; nothing is sent on a mismatch or bad input."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import ExportPlan, ExportStatus, Sent
from gym_artifacts.core.atomic import atomic_writer
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities
from gym_artifacts.run.receipts import read_receipt
from tests.backends import CountingExporter, CrashingExporter, ExplodingExporter
from tests.processes import run_bounded


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
    proc = run_bounded([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, timeout=120)
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


# -- the re-export check (SKIPPED) reads no rollouts, yet never skips a changed run ------------


def bytes_read_during(action: object) -> int:
    """Bytes this process read (any file, any module: ``rchar`` of ``/proc/self/io``) in ``action()``."""

    def rchar() -> int:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))

    before = rchar()
    action()  # type: ignore[operator]
    return rchar() - before


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="reads are counted by Linux's /proc")
def test_skip_reads_nothing_that_grows_with_the_rollouts(quickstart_run: Path) -> None:
    """A SKIP answers from stat calls, the identity cache and the receipt: of rollouts of 6 MB it
    reads at most the end (a torn last line is looked for), even for a run that saved no config
    (whose params are read from the rollouts only once a backend is about to send)."""
    import orjson

    rows = [orjson.loads(line) for line in quickstart_run.read_bytes().splitlines()]
    quickstart_run.write_bytes(b"".join(orjson.dumps({**r, "padding": "x" * 20_000}) + b"\n" for r in rows))
    assert quickstart_run.stat().st_size > 6_000_000
    quickstart_run.with_name("eval_config.yaml").unlink()  # as NeMo Gym writes it: no config saved
    run = RunArtifacts.from_path(quickstart_run)
    old = os.stat(quickstart_run).st_mtime - 120  # outside the identity cache's racy window
    for p in [quickstart_run, *quickstart_run.parent.rglob("*")]:
        if p.is_file():
            os.utime(p, (old, old))
    [first] = export_run(run, cfg(counting=True))
    assert first.status is ExportStatus.EXPORTED
    export_run(run, cfg(counting=True))  # imports and caches warm
    results: list = []
    read = bytes_read_during(lambda: results.extend(export_run(run, cfg(counting=True))))
    assert [r.status for r in results] == [ExportStatus.SKIPPED]
    assert read < 1_000_000, f"a SKIP read {read:,} bytes"
    assert len(CountingExporter.sends) == 1


def _flip_one_byte_keeping_size_and_mtime(fpath: Path) -> None:
    st = fpath.stat()
    data = bytearray(fpath.read_bytes())
    i = data.index(b"0") if b"0" in data else len(data) // 2
    data[i : i + 1] = b"1" if data[i : i + 1] == b"0" else b"0"  # still valid JSON
    fpath.write_bytes(bytes(data))
    os.utime(fpath, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fpath.stat().st_size == st.st_size and fpath.stat().st_mtime_ns == st.st_mtime_ns


def _truncate_to_its_first_line(fpath: Path) -> None:
    first = fpath.read_bytes().splitlines(keepends=True)[0]
    st = fpath.stat()
    with open(fpath, "r+b") as fh:
        fh.truncate(len(first))
    os.utime(fpath, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace_by_a_symlink_to_a_changed_copy(fpath: Path) -> None:
    copy = fpath.with_name("elsewhere.jsonl")
    copy.write_bytes(fpath.read_bytes())
    _flip_one_byte_keeping_size_and_mtime(copy)
    st = fpath.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    fpath.unlink()
    fpath.symlink_to(copy.name)


@pytest.mark.parametrize(
    "change",
    [
        _flip_one_byte_keeping_size_and_mtime,
        _truncate_to_its_first_line,
        _replace_by_a_symlink_to_a_changed_copy,
    ],
    ids=["one-byte-same-size-and-mtime", "truncated-mtime-restored", "symlink"],
)
def test_a_changed_rollouts_file_is_never_skipped(quickstart_run: Path, change: object) -> None:
    """Whatever the cache remembers, a changed rollouts file is seen: no SKIP, nothing sent over
    the old receipt; deleting the receipt exports the changed run under a new identity."""
    run = RunArtifacts.from_path(quickstart_run)
    old = os.stat(quickstart_run).st_mtime - 120
    for p in [quickstart_run, *quickstart_run.parent.rglob("*")]:
        if p.is_file():
            os.utime(p, (old, old))
    [first] = export_run(run, cfg(counting=True))
    [again] = export_run(run, cfg(counting=True))
    assert (first.status, again.status) == (ExportStatus.EXPORTED, ExportStatus.SKIPPED)
    change(quickstart_run)  # type: ignore[operator]
    [changed] = export_run(run, cfg(counting=True))
    assert changed.status is ExportStatus.FAILED, changed.reason
    # the changed identity is named; a truncated run is first refused for its missing rollouts
    assert "rollouts.jsonl changed" in (changed.reason or "") or "not exportable" in (changed.reason or "")
    assert len(CountingExporter.sends) == 1
    if "not exportable" not in (changed.reason or ""):
        run.export_done_fpath("counting").unlink()
        [anew] = export_run(run, cfg(counting=True))
        assert anew.status is ExportStatus.EXPORTED, anew.reason
        assert len(set(CountingExporter.sends)) == 2


class ParamsSeenExporter(CountingExporter):
    """Records the params (``plan.config``) each send was given."""

    name = "params_seen"
    configs: ClassVar[list[Any]] = []

    def _export(self, run: RunArtifacts, plan: ExportPlan) -> Sent:
        ParamsSeenExporter.configs.append(plan.config)
        return super()._export(run, plan)


def test_params_read_from_the_rollouts_reach_a_send_after_a_skip(quickstart_run: Path) -> None:
    """A run without a saved config: one backend SKIPs (no params read), the next one sends and
    gets the params the rollouts tell (agent, model, repeats)."""
    quickstart_run.with_name("eval_config.yaml").unlink()
    export_run(quickstart_run, cfg(counting=True))
    registry.register(ParamsSeenExporter)
    ParamsSeenExporter.configs.clear()
    try:
        results = export_run(quickstart_run, cfg(counting=True, params_seen=True))
    finally:
        registry.unregister(ParamsSeenExporter.name)
    assert [r.status for r in results] == [ExportStatus.SKIPPED, ExportStatus.EXPORTED]
    [params] = ParamsSeenExporter.configs
    assert params is not None and params["agent_name"] and params["num_repeats"] == 4, params
