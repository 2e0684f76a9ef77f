"""The TensorBoard backend, read back with TensorBoard's own event reader (EventAccumulator)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    HISTOGRAMS,
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.tensorboard import TensorboardExporter
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
CANARY = "sk-tensorboard-canary-3f9d2e"


def tb_cfg(logdir: Path, **extra: Any) -> Any:
    return OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(logdir), **extra}}})


def read_run(dpath: Path) -> EventAccumulator:
    acc = EventAccumulator(str(dpath), size_guidance={SCALARS: 0, TENSORS: 0, HISTOGRAMS: 0})
    acc.Reload()
    return acc


def texts(acc: EventAccumulator, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]


def run_folders(logdir: Path) -> list[Path]:
    return sorted(p for p in logdir.iterdir() if p.is_dir())


def rollouts(fpath: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in fpath.read_text().splitlines()]


def assert_histogram_of(histogram: Any, values: list[float]) -> None:
    """TensorBoard's histogram holds exactly ``values``: count, sum, range, and each bucket
    ``[previous limit, limit)`` the number of values in it."""
    assert histogram.num == len(values)
    assert histogram.sum == pytest.approx(sum(values))
    assert histogram.sum_squares == pytest.approx(sum(v * v for v in values))
    assert (histogram.min, histogram.max) == (min(values), max(values))
    lower = float("-inf")
    for limit, count in zip(histogram.bucket_limit, histogram.bucket, strict=True):
        assert count == sum(1 for v in values if lower <= v < limit), (lower, limit)
        lower = limit
    assert sum(histogram.bucket) == len(values)


def assert_quickstart_once(run_dir: Path, quickstart_run: Path) -> None:
    acc = read_run(run_dir)
    records = rollouts(quickstart_run)
    # each rollout's reward at its index in completion order; the distribution over the rollouts
    # so far at several steps, the last one the whole run
    assert [e.value for e in acc.Scalars("rollout/reward")] == [r["reward"] for r in records]
    history = acc.Histograms("rollouts/reward")
    assert len(history) > 1
    rewards = history[-1]
    assert rewards.step == len(records)
    assert_histogram_of(rewards.histogram_value, [r["reward"] for r in records])
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
    header = groups.splitlines()[0].strip("| ").split(" | ")
    assert header[:2] == ["_ng_task_index", "agent"] and "mean/reward" in header and len(header) <= 12
    assert "`tables/group_level_metrics.jsonl` beside the event files" in groups
    attached = [json.loads(x) for x in (run_dir / "tables" / "group_level_metrics.jsonl").read_text().splitlines()]
    assert len(attached[0]) > len(header) and "rollout_infos" in attached[0]  # every column, there
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


@pytest.mark.slow
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
            def die(self, w, records, *a):
                for i, _ in enumerate(records):
                    w.scalars({{"rollouts/reward": 1.0}}, i, 0.0)
                    if i == 100:
                        w.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
            tb.TensorboardExporter._write_rollouts = die
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "tensorboard",
                       "exporters.tensorboard.logdir={logdir}"]))
        """
    )
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
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
    with pytest.raises(RuntimeError), live_run(cfg, out) as live:
        for step in range(3):
            live.export_metrics({"loss": 1.0 / (step + 1), "phase": "warmup"}, step=step)
        live.export_rollouts([{"task_index": i, "reward": float(i % 2)} for i in range(4)])
        out.write_text("".join(json.dumps({"task_index": i}) + "\n" for i in range(4)))
        raise RuntimeError("preempted")
    first_id = live.reports[0].run_id
    with live_run(cfg, out) as live:
        live.export_metrics({"loss": 0.1}, step=3)
        live.export_rollouts([{"task_index": 4, "reward": 1.0}])
    assert live.reports[0].run_id == first_id
    [run_dir] = run_folders(logdir)
    assert run_dir.name == first_id
    acc = read_run(run_dir)
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2, 3]
    batches = acc.Histograms("rollouts/reward")  # a histogram per batch, at the rollouts covered
    assert [e.step for e in batches] == [4, 5]
    assert_histogram_of(batches[0].histogram_value, [0.0, 1.0, 0.0, 1.0])
    assert_histogram_of(batches[1].histogram_value, [1.0])
    assert texts(acc, "phase") == [(0, "warmup"), (1, "warmup"), (2, "warmup")]
    config_texts = [t for _, t in texts(acc, "config")]
    assert config_texts and all("***" in t and CANARY not in t for t in config_texts)
    assert sorted({t for _, t in texts(acc, "status")}) == ["FAILED", "FINISHED"]


def test_table_is_bounded_while_every_reward_is_in_the_histogram(quickstart_run: Path, tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    [result] = export_run(quickstart_run, tb_cfg(logdir, table_rows=120))
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = read_run(logdir / result.backend_run_id)
    rewards = acc.Histograms("rollouts/reward")[-1]  # the last step: every rollout
    assert rewards.histogram_value.num == 300
    rows = [line for _, chunk in texts(acc, "rollouts/table") for line in chunk.splitlines()[2:]]
    assert len(rows) == 120
    [(_, note)] = texts(acc, "rollouts/table_note")
    assert "first 120 of 300" in note
    [events] = (logdir / result.backend_run_id).glob("events.out.tfevents.*")
    assert os.path.getsize(events) < 400_000


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


def test_token_distributions_from_the_responses_usage(tmp_path: Path) -> None:
    """A real NeMo Gym run: input, output and total tokens of every Response as histograms."""
    import shutil

    from tests.fixture_paths import NEMO_GYM_FIXTURES

    run = tmp_path / "run"
    shutil.copytree(NEMO_GYM_FIXTURES / "with-failures", run)
    [result] = export_run(run / "rollouts.jsonl", tb_cfg(tmp_path / "tb"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = read_run(tmp_path / "tb" / result.backend_run_id)
    records = rollouts(run / "rollouts.jsonl")
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        h = acc.Histograms(f"rollouts/{key}")[-1]
        assert h.step == len(records)
        assert_histogram_of(h.histogram_value, [float(r["response"]["usage"][key]) for r in records])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=200))
def test_histogram_buckets_hold_exactly_the_finite_values(values: list[float]) -> None:
    import math

    from gym_artifacts._builtin_exporters._histogram import LIMITS, Histogram

    h = Histogram().extend(values)
    finite = [v for v in values if math.isfinite(v)]
    assert h.num == len(finite) and len(h.counts) <= len(LIMITS)
    limits, counts = h.buckets()
    assert limits == sorted(limits) and len(set(limits)) == len(limits)
    lower = float("-inf")
    for limit, count in zip(limits, counts, strict=True):
        assert count == sum(1 for v in finite if lower <= v < limit or (limit == LIMITS[-1] and v == limit))
        lower = limit


cell_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


@settings(max_examples=40, deadline=None)
@given(
    extra=st.lists(cell_text, max_size=40, unique=True),
    rows=st.lists(st.tuples(st.integers(0, 10**6), cell_text, st.floats(allow_nan=False)), max_size=20),
)
def test_level_table_stays_a_few_columns_whatever_the_level_holds(
    extra: list[str], rows: list[tuple[int, str, float]]
) -> None:
    """Any column names and cells (pipes, newlines, 40 extra columns): one Markdown row per
    level row, the same number of cells in each, never more than the chosen columns."""
    from gym_artifacts._builtin_exporters.tensorboard import LEVEL_COLUMNS, level_markdown
    from gym_artifacts.run.aggregate import LevelTable

    names = [n for n in extra if n not in ("agent", "_ng_task_index", "mean/reward")]
    columns = ["agent", "_ng_task_index", "mean/reward", *names]
    table = LevelTable(
        "group_level_metrics", "_ng_task_index", columns,
        [[agent, index, reward, *([agent] * len(names))] for index, agent, reward in rows],
    )  # fmt: skip
    text = level_markdown(table, 1000, "tables/group_level_metrics.jsonl")
    lines = text.splitlines()
    header_cells = len(lines[0].split(" | "))
    assert header_cells <= 2 + len(LEVEL_COLUMNS)
    body = lines[2 : 2 + len(rows)]
    assert len(body) == len(rows)
    for line in body:
        unescaped = line.replace("\\|", "")
        assert unescaped.count("|") == header_cells + 1, line


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000))
def test_records_are_framed_as_tensorboards_own_writer_frames_them(data: bytes) -> None:
    """The event files' framing (``_tfrecord``) is byte for byte what TensorBoard's writer writes."""
    import io

    from tensorboard.summary.writer.record_writer import RecordWriter

    from gym_artifacts._builtin_exporters._tfrecord import tfrecord

    sink = io.BytesIO()
    RecordWriter(sink).write(data)
    assert tfrecord(data) == sink.getvalue()


def test_an_export_loads_only_tensorboards_protos(quickstart_run: Path, tmp_path: Path) -> None:
    """Not its summary writer and the TensorFlow stub behind it (half a second of imports)."""
    script = textwrap.dedent(
        f"""
        import sys
        from omegaconf import OmegaConf
        from gym_artifacts.export.engine import export_run
        cfg = OmegaConf.create({{"exporters": {{"tensorboard": {{"enabled": True, "logdir": {str(tmp_path / "tb")!r}}}}}}})
        [result] = export_run({str(quickstart_run)!r}, cfg)
        assert result.status.value == "EXPORTED", result.reason
        print(sorted(m for m in sys.modules if m.startswith(("tensorboard.summary", "tensorboard.compat.tensorflow_stub"))))
        """
    )
    proc = run_bounded(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    [run_dir] = run_folders(tmp_path / "tb")
    assert_quickstart_once(run_dir, quickstart_run)
