"""The TensorBoard backend, read back with TensorBoard's own event reader (EventAccumulator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from gym_artifacts._builtin_exporters.tensorboard import TensorboardExporter
from gym_artifacts.export import export_run
from gym_artifacts.exporter import ExportStatus
from gym_artifacts.live import live_exporters
from gym_artifacts.receipts import read_receipts
from gym_artifacts.run import RunArtifacts

REPO = Path(__file__).resolve().parent.parent
CANARY = "sk-tensorboard-canary-3f9d2e"


def tb_cfg(logdir: Path, **extra: Any) -> Any:
    return OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(logdir), **extra}}})


def read_run(dpath: Path) -> EventAccumulator:
    acc = EventAccumulator(str(dpath), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    return acc


def texts(acc: EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def run_folders(logdir: Path) -> list[Path]:
    return sorted(p for p in logdir.iterdir() if p.is_dir())


def rollouts(fpath: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in fpath.read_text().splitlines()]


def assert_quickstart_once(run_dir: Path, quickstart_run: Path) -> None:
    acc = read_run(run_dir)
    records = rollouts(quickstart_run)
    rewards = acc.Scalars("rollouts/reward")
    assert [(e.step, e.value) for e in rewards] == [(i, r["reward"]) for i, r in enumerate(records)]
    table = texts(acc, "rollouts/table")
    rows = [line for _, chunk in table for line in chunk.splitlines()[2:]]
    assert [int(line.split("|")[1]) for line in rows] == list(range(len(records)))


def test_post_run_export_reads_back(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLICY_API_KEY", CANARY)
    logdir = tmp_path / "tb"
    [result] = export_run(quickstart_run, tb_cfg(logdir))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.rows == 300
    [run_dir] = run_folders(logdir)
    assert run_dir.name == result.backend_run_id
    assert_quickstart_once(run_dir, quickstart_run)
    acc = read_run(run_dir)
    # the journal at its original steps and wall times
    journal = [json.loads(x) for x in quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert [(e.step, e.wall_time, e.value) for e in acc.Scalars("train/reward")] == [
        (j["step"], j["time"], pytest.approx(j["metrics"]["train/reward"])) for j in journal
    ]
    # aggregate metrics at every level
    agg = json.loads(quickstart_run.with_name("eval_aggregate_metrics.json").read_text())
    [mean] = acc.Scalars("key_metrics/travel_simple_agent/mean/reward")
    assert mean.value == pytest.approx(agg[1]["key_metrics"]["mean/reward"])
    [scored] = acc.Scalars("coverage/scored")
    assert scored.value == 300
    # levels are texts (tables), never per-task scalars; indexes are no rollout verdicts
    assert not [t for t in acc.Tags()["scalars"] if "level_metrics" in t or "_ng_" in t or "mask_sample" in t]
    [(_, groups)] = texts(acc, "tables/group_level_metrics")
    assert groups.startswith("| agent | _ng_task_index |")
    # the config, masked
    [(_, config)] = texts(acc, "config")
    assert json.loads(config.strip("`\njson"))["policy_api_key"] == "***"
    # no secret anywhere TensorBoard reads
    for f in logdir.rglob("*"):
        if f.is_file():
            assert CANARY.encode() not in f.read_bytes(), f


def test_second_export_is_skipped_and_writes_nothing(quickstart_run: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    [first] = export_run(quickstart_run, tb_cfg(logdir))
    before = {p: p.stat().st_mtime_ns for p in logdir.rglob("*")}
    [again] = export_run(quickstart_run, tb_cfg(logdir))
    assert again.status is ExportStatus.SKIPPED
    assert again.backend_run_id == first.backend_run_id
    assert {p: p.stat().st_mtime_ns for p in logdir.rglob("*")} == before


@pytest.mark.parametrize("kill_at", ["_write_rollouts", "replace"])
def test_sigkilled_export_rerun_leaves_no_duplicate(
    quickstart_run: Path, tmp_path: Path, kill_at: str
) -> None:
    """Killed while writing the rollouts, or after the folder is in place but before the receipt."""
    logdir = tmp_path / "tb"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import tensorboard as tb
        if {kill_at!r} == "replace":
            real = os.replace
            def die(src, dst):
                real(src, dst)
                os.kill(os.getpid(), signal.SIGKILL)
            tb.os.replace = die
        else:
            def die(self, w, rollouts, *a):
                for i, r in enumerate(rollouts):
                    w.scalars({{"rollouts/reward": 1.0}}, r.row, 0.0)
                    if i == 100:
                        w.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
            tb.TensorboardExporter._write_rollouts = die
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "tensorboard",
                       "exporters.tensorboard.logdir={logdir}"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert not RunArtifacts.from_path(quickstart_run).export_done_fpath("tensorboard").exists()
    [result] = export_run(quickstart_run, tb_cfg(logdir))
    assert result.status is ExportStatus.EXPORTED, result.reason
    [run_dir] = run_folders(logdir)  # no partial folder left, no second run
    assert run_dir.name == result.backend_run_id
    assert_quickstart_once(run_dir, quickstart_run)
    [again] = export_run(quickstart_run, tb_cfg(logdir))
    assert again.status is ExportStatus.SKIPPED


def test_live_logging_appends_on_resume(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    out = tmp_path / "live" / "eval.jsonl"
    out.parent.mkdir()
    cfg = {"exporters": {"tensorboard": {"enabled": True, "logdir": str(logdir)}},
           "resume": True, "policy_api_key": CANARY}  # fmt: skip
    with pytest.raises(RuntimeError), live_exporters(cfg, out) as live:
        for step in range(3):
            live.export_metrics({"loss": 1.0 / (step + 1), "phase": "warmup"}, step=step)
        live.export_rollouts([{"task_index": i, "reward": float(i % 2)} for i in range(4)])
        out.write_text("".join(json.dumps({"task_index": i}) + "\n" for i in range(4)))
        raise RuntimeError("preempted")
    first_id = live.reports[0].run_id
    with live_exporters(cfg, out) as live:
        live.export_metrics({"loss": 0.1}, step=3)
        live.export_rollouts([{"task_index": 4, "reward": 1.0}])
    assert live.reports[0].run_id == first_id
    [run_dir] = run_folders(logdir)
    assert run_dir.name == first_id
    acc = read_run(run_dir)
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2, 3]
    assert [(e.step, e.value) for e in acc.Scalars("rollouts/reward")] == [
        (0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0), (4, 1.0)
    ]  # fmt: skip
    assert texts(acc, "phase") == [(0, "warmup"), (1, "warmup"), (2, "warmup")]
    config_texts = [t for _, t in texts(acc, "config")]
    assert config_texts and all("***" in t and CANARY not in t for t in config_texts)
    assert sorted({t for _, t in texts(acc, "status")}) == ["FAILED", "FINISHED"]


def test_table_is_bounded_while_every_reward_is_a_scalar(quickstart_run: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    [result] = export_run(quickstart_run, tb_cfg(logdir, table_rows=120))
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = read_run(logdir / result.backend_run_id)
    assert len(acc.Scalars("rollouts/reward")) == 300
    rows = [line for _, chunk in texts(acc, "rollouts/table") for line in chunk.splitlines()[2:]]
    assert len(rows) == 120
    [(_, note)] = texts(acc, "rollouts/table_note")
    assert "first 120 of 300" in note
    assert os.path.getsize(next((logdir / result.backend_run_id).iterdir())) < 400_000


def test_two_log_folders_get_one_run_each_and_skip_without_writing(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two log folders (one named relative to the working folder) are two destinations: a run
    folder and a receipt in each; re-exports to either skip and write nothing."""
    monkeypatch.chdir(tmp_path)
    logdirs = [tmp_path / "tb1", Path("tb2")]
    first = []
    for logdir in logdirs:
        [result] = export_run(quickstart_run, tb_cfg(logdir))
        assert result.status is ExportStatus.EXPORTED, result.reason
        [run_dir] = run_folders(logdir)
        assert_quickstart_once(run_dir, quickstart_run)
        first.append(result.backend_run_id)
    receipts = read_receipts(RunArtifacts.from_path(quickstart_run).export_done_fpath("tensorboard"))
    assert sorted(r.destination["logdir"] for r in receipts) == [str(tmp_path / "tb1"), str(tmp_path / "tb2")]
    before = {p: p.stat().st_mtime_ns for d in logdirs for p in d.rglob("*")}
    for logdir, backend_run_id in zip(logdirs, first, strict=True):
        [again] = export_run(quickstart_run, tb_cfg(logdir, table_rows=7, run_name="renamed"))
        assert again.status is ExportStatus.SKIPPED, again.reason  # display settings: same destination
        assert again.backend_run_id == backend_run_id
    assert {p: p.stat().st_mtime_ns for d in logdirs for p in d.rglob("*")} == before


def test_destination_is_the_resolved_log_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def destination(logdir: str) -> dict[str, Any]:
        cfg = tb_cfg(Path(logdir), run_name="r", table_rows=3)
        return TensorboardExporter.destination_for(TensorboardExporter.settings_from(cfg))

    assert destination("runs/../tb") == {"logdir": str(tmp_path / "tb")}
    assert destination("~/tb") == {"logdir": str(tmp_path / "home" / "tb")}
