"""The W&B backend with the real SDK in offline mode, read back from the runs' ``.wandb`` files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("wandb")

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run
from gym_artifacts.run.artifacts import RunArtifacts
from tests.load import scaled
from tests.mlflow_server import free_port
from tests.processes import reaped, run_bounded
from tests.wandb_records import offline_runs

REPO = Path(__file__).resolve().parent.parent
API_KEY = "wandb-key-canary-" + "3f" * 16


def wandb_section(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "project": "tests",
        "mode": "offline",
        "dir": str(tmp_path / "wb"),
        "api_key": API_KEY,
        **extra,
    }


def unplan(run: Path) -> None:
    """The rollouts were replaced by others: drop the quickstart's plan of 300 (inputs, levels)."""
    run.with_name("eval_materialized_inputs.jsonl").unlink()
    run.with_name("eval_aggregate_metrics.json").write_text(
        '[{"agent_ref": {"name": "a"}, "agent_metrics": {}}]'
    )


@pytest.mark.slow
def test_post_run_export_offline_reads_back(quickstart_run: Path, tmp_path: Path) -> None:
    cfg = OmegaConf.create({"exporters": {"wandb": wandb_section(tmp_path)}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.rows == 300
    [run] = offline_runs(tmp_path / "wb")
    assert run.run_id == result.backend_run_id
    assert run.exit_code == 0
    # config, masked
    assert run.config["policy_model_name"] == "quickstart-policy"
    assert run.config["policy_api_key"] == "***"
    # every journal metric at its step
    journal = [json.loads(x) for x in quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert run.steps == [j["step"] for j in journal]
    assert [row["train/reward"] for row in run.history] == [j["metrics"]["train/reward"] for j in journal]
    # aggregate metrics in the summary, not at a step
    agg = json.loads(quickstart_run.with_name("eval_aggregate_metrics.json").read_text())
    # under NeMo Gym's own exporter's names; per-task/per-repeat levels as tables, not summary values
    assert run.summary["key_metrics/travel_simple_agent/mean/reward"] == pytest.approx(
        agg[1]["key_metrics"]["mean/reward"]
    )
    assert run.summary["travel_simple_agent/mean_across_repeats/mean/reward"] == pytest.approx(
        agg[1]["agent_metrics"]["mean_across_repeats/mean/reward"]
    )
    assert run.summary["omitted_rows"] == 0
    assert run.summary["coverage/expected"] == run.summary["coverage/scored"] == 300
    assert not any("group_level" in k and "/" in k.removeprefix("tables/") for k in run.summary)
    groups = json.loads(run.file(run.summary["tables/group_level_metrics"]["path"]).read_text())
    assert groups["columns"][:2] == ["agent", "_ng_task_index"] and len(groups["data"]) == 75
    assert "NVML unavailable" in run.summary["system/nvml"]
    assert not any("aggregate" in k for row in run.history for k in row)
    # the rollout table: what a person reads in each rollout, every row
    table_ref = run.summary["rollouts"]
    table = json.loads(run.file(table_ref["path"]).read_text())
    rows = [json.loads(x) for x in quickstart_run.read_text().splitlines()]
    assert table["columns"] == READABLE
    assert len(table["data"]) == 300
    assert table["data"][7][table["columns"].index("reward")] == rows[7]["reward"]
    assert run.summary["rollouts/rows"] == 300
    # the video and the artifacts
    assert run.summary["recording"]["_type"] == "video-file"
    assert (
        run.file(run.summary["recording"]["path"]).read_bytes()
        == (quickstart_run.with_name("eval_artifacts") / "recording.mp4").read_bytes()
    )
    types = {a["type"] for a in run.artifacts}
    assert {"rollouts", "profile", "nvml", "recording", "runtime"} <= types


@pytest.mark.slow
def test_rollouts_with_differing_schemas_use_one_json_column(quickstart_run: Path, tmp_path: Path) -> None:
    quickstart_run.write_text('{"a": 1}\n{"b": [1, 2]}\n{"a": 2, "c": {"d": 3}}\n')
    unplan(quickstart_run)
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    cfg = OmegaConf.create({"exporters": {"wandb": wandb_section(tmp_path)}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    [run] = offline_runs(tmp_path / "wb")
    table = json.loads(run.file(run.summary["rollouts"]["path"]).read_text())
    assert table["columns"] == ["rollout"]
    assert [json.loads(r[0]) for r in table["data"]] == [{"a": 1}, {"b": [1, 2]}, {"a": 2, "c": {"d": 3}}]


@pytest.mark.slow
def test_large_rollout_sets_are_split_not_truncated(quickstart_run: Path, tmp_path: Path) -> None:
    quickstart_run.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(25)))
    unplan(quickstart_run)
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    cfg = OmegaConf.create(
        {"exporters": {"wandb": wandb_section(tmp_path, table_max_rows=10, artifact_part_rows=10)}}
    )
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED and result.rows == 25
    [run] = offline_runs(tmp_path / "wb")
    assert "rollouts" not in run.summary  # too many for one table
    assert run.summary["rollouts/parts"] == 3 and run.summary["rollouts/rows"] == 25
    [artifact] = [a for a in run.artifacts if a["type"] == "rollouts"]
    names = {c["path"] for c in artifact["manifest"]["contents"]}
    assert {
        "rollouts_part_0.table.json",
        "rollouts_part_1.table.json",
        "rollouts_part_2.table.json",
        "rollouts.jsonl",
    } <= names


@pytest.mark.slow
def test_retried_export_uses_the_same_run_id_and_reexport_skips_without_wandb(
    quickstart_run: Path, tmp_path: Path
) -> None:
    cfg = OmegaConf.create({"exporters": {"wandb": wandb_section(tmp_path)}})
    [first] = export_run(quickstart_run, cfg)
    RunArtifacts.from_path(quickstart_run).export_done_fpath(
        "wandb"
    ).unlink()  # as if it died before the receipt
    [second] = export_run(quickstart_run, cfg)
    assert second.backend_run_id == first.backend_run_id
    script = textwrap.dedent(
        f"""
        import sys, json
        from gym_artifacts.cli import main
        code = main(["export", {str(quickstart_run)!r}, "-e", "wandb", "--json",
                     "exporters.wandb.dir={tmp_path / "wb"}", "exporters.wandb.mode=offline",
                     "exporters.wandb.project=tests"])  # the receipt's destination
        assert "wandb" not in sys.modules, "wandb was imported"
        sys.exit(code)
        """
    )
    proc = run_bounded(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["status"] == "SKIPPED"


@pytest.mark.slow
def test_two_offline_folders_are_two_destinations(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offline run lands in its folder: exporting to a second folder is a second destination
    (exported there, a second receipt), the same folder spelled otherwise is not; with no ``dir``
    the folder is ``WANDB_DIR``, else the working folder."""
    first, second = tmp_path / "a", tmp_path / "b"

    def export_to(folder: str | None) -> ExportStatus:
        section = wandb_section(tmp_path, dir=folder)
        [result] = export_run(quickstart_run, OmegaConf.create({"exporters": {"wandb": section}}))
        assert result.status is not ExportStatus.FAILED, result.reason
        return result.status

    assert export_to(str(first)) is ExportStatus.EXPORTED
    assert export_to(str(second)) is ExportStatus.EXPORTED
    monkeypatch.chdir(tmp_path)
    assert export_to("a/") is ExportStatus.SKIPPED
    assert len(offline_runs(first)) == len(offline_runs(second)) == 1
    receipts = RunArtifacts.from_path(quickstart_run).export_done_fpath("wandb")
    assert receipts.exists()
    monkeypatch.setenv("WANDB_DIR", str(second))
    assert export_to(None) is ExportStatus.SKIPPED  # WANDB_DIR names the second folder
    monkeypatch.delenv("WANDB_DIR")
    monkeypatch.chdir(first)
    assert export_to(None) is ExportStatus.SKIPPED  # the working folder is the first


@pytest.mark.slow
def test_live_run_config_metrics_and_rollouts(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"wandb": wandb_section(tmp_path)}, "judge": {"api_key": API_KEY, "model": "j"}}
    with live_run(cfg, out) as live:
        for step in range(5):
            live.export_metrics({"loss": 1 / (step + 1), "nested": {"acc": step / 5}}, step=step)
        live.export_rollouts([{"id": 1, "reward": 1.0}, {"id": 2, "reward": 0.0}])
        live.flush(60)
        # Held on disk, not in memory, until teardown sends them as one table.
        [exporter] = live.exporters
        spooled = exporter._rollouts.path
        assert spooled is not None and spooled.read_bytes().count(b"\n") == 2
        import wandb

        assert wandb.run is None  # our run never becomes the process's global run
        assert "WANDB_API_KEY" not in os.environ
    assert live.reports[0].lost == 0, live.reports[0].describe()
    [run] = offline_runs(tmp_path / "wb")
    assert run.steps == [0, 1, 2, 3, 4]
    assert run.history[2]["nested/acc"] == pytest.approx(0.4)
    assert run.config["judge"] == {"api_key": "***", "model": "j"}
    table = json.loads(run.file(run.summary["rollouts"]["path"]).read_text())
    assert table["data"] == [[1, 1.0], [2, 0.0]]
    assert not spooled.exists()  # the spool is removed once sent


LIVE_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from gym_artifacts.live import live_run
    wbdir, out, first, last, hang = sys.argv[1:6]
    cfg = {"exporters": {"wandb": {"enabled": True, "project": "tests", "mode": "offline", "dir": wbdir}},
           "resume": True}
    with live_run(cfg, out) as live:
        for step in range(int(first), int(last)):
            live.export_metrics({"value": step}, step=step)
        assert live.flush(60)
        print("ready", flush=True)
        if hang == "hang":
            time.sleep(120)
    """
)


@pytest.mark.slow
def test_killed_live_run_resumes_with_growing_steps(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"

    def run_steps(first: int, last: int, *, kill: bool) -> None:
        args = [
            sys.executable,
            "-c",
            LIVE_SCRIPT,
            str(tmp_path / "wb"),
            str(out),
            str(first),
            str(last),
            "hang" if kill else "exit",
        ]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=REPO)
        with reaped(proc):
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            if kill:
                os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(120) == (-9 if kill else 0)

    run_steps(0, 10, kill=True)
    run_steps(5, 15, kill=False)  # restarts from a checkpoint at step 5: 5-9 are not written again
    first, second = offline_runs(tmp_path / "wb")
    assert first.run_id == second.run_id
    assert second.steps == list(range(10, 15))
    assert min(second.steps) > max(first.steps, default=-1)


def test_online_without_network_fails_fast_in_isolation(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    closed = f"http://127.0.0.1:{free_port()}"
    cfg = {
        "exporters": {
            "wandb": wandb_section(tmp_path, mode="online", base_url=closed, init_timeout=2),
            "local": {"enabled": True, "root": str(tmp_path / "store")},
        }
    }
    started = time.monotonic()
    costs = []
    with live_run(cfg, out, teardown_timeout=10) as live:
        for step in range(100):
            t0 = time.perf_counter()
            live.export_metrics({"x": step}, step=step)
            costs.append(time.perf_counter() - t0)
    elapsed = time.monotonic() - started
    reports = {r.exporter: r for r in live.reports}
    assert reports["wandb"].setup_error is not None
    assert reports["local"].lost == 0 and reports["local"].delivered >= 100
    assert sorted(costs)[95] < 1e-3 and max(costs) < 0.5
    assert elapsed < scaled(15)


@pytest.mark.slow
def test_online_without_key_never_prompts(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from gym_artifacts.live import live_run
        cfg = {{"exporters": {{"wandb": {{"enabled": True, "project": "t", "mode": "online",
                "base_url": "http://127.0.0.1:{free_port()}", "init_timeout": 2, "dir": {str(tmp_path / "wb")!r}}}}}}}
        with live_run(cfg, {str(tmp_path / "eval.jsonl")!r}) as live:
            live.export_metrics({{"x": 1}})
        print("setup_error:", live.reports[0].setup_error)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["WANDB_MODE"] = "online"
    proc = run_bounded(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "setup_error: " in proc.stdout and "setup_error: None" not in proc.stdout


@pytest.mark.slow
def test_api_key_appears_in_no_wandb_file(quickstart_run: Path, tmp_path: Path) -> None:
    cfg = OmegaConf.create({"exporters": {"wandb": wandb_section(tmp_path)}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED
    with live_run({"exporters": {"wandb": wandb_section(tmp_path)}}, tmp_path / "l.jsonl") as live:
        live.export_metrics({"x": 1}, step=0)
    assert "WANDB_API_KEY" not in os.environ
    roots = [
        tmp_path / "wb",
        *(
            Path(os.environ[v])
            for v in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")
        ),
    ]
    files = [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]
    assert len(files) > 10
    for p in files:
        assert API_KEY.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_interpreter_exit_tears_down_before_wandb_exit_hook(tmp_path: Path) -> None:
    """A script that never tears down: our atexit hook (registered after wandb's) ends the runs."""
    script = textwrap.dedent(
        f"""
        from omegaconf import OmegaConf
        from gym_artifacts.core.config import normalize
        from gym_artifacts.live.fanout import LiveRun, build_live_exporters
        from gym_artifacts.run.artifacts import RunArtifacts
        cfg = normalize(OmegaConf.create({{"exporters": {{
            "wandb": {{"enabled": True, "mode": "offline", "project": "t", "dir": {str(tmp_path / "wb")!r}}},
            "local": {{"enabled": True, "root": {str(tmp_path / "local")!r}}}}}}}))
        live = LiveRun(RunArtifacts.from_path({str(tmp_path / "eval.jsonl")!r}), build_live_exporters(cfg), cfg, resume=False)
        for step in range(20):
            live.export_metrics({{"x": step}}, step=step)
        live.flush(60)
        # the script ends here without teardown
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = run_bounded(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = offline_runs(tmp_path / "wb")
    assert run.steps == list(range(20))
    assert run.exit_code == 1  # ended by our hook as KILLED, not left to wandb's own exit hook
    [local] = list((tmp_path / "local" / "default").iterdir())
    assert json.loads((local / "run.json").read_text())["status"] == "KILLED"


# -- what W&B shows of a NeMo Gym run (issue 39): one readable rollouts table with every planned
# rollout (failed ones too), the headline in the run's notes, one table artifact per live run
READABLE = ["task", "repeat", "agent", "prompt", "answer", "tool_calls", "input_tokens", "output_tokens",
            "total_tokens", "reward", "failed", "failure"]  # fmt: skip


def test_rollouts_table_is_readable_with_every_planned_rollout_and_the_headline(tmp_path: Path) -> None:
    from tests.test_mlflow_traces import fixture_run

    rollouts = fixture_run(tmp_path)
    [result] = export_run(rollouts, OmegaConf.create({"exporters": {"wandb": wandb_section(tmp_path)}}))
    assert result.status is ExportStatus.EXPORTED, result.reason
    [run] = offline_runs(tmp_path / "wb")
    table = json.loads(run.file(run.summary["rollouts"]["path"]).read_text())
    assert table["columns"] == READABLE
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert len(rows) == 10 and sum(r["failed"] for r in rows) == 2
    failed = [r for r in rows if r["failed"]]
    assert all("ClientResponseError" in r["failure"] and r["prompt"] and r["reward"] is None for r in failed)
    scored = [r for r in rows if not r["failed"]]
    assert all(r["prompt"] and r["answer"] and r["total_tokens"] > 0 for r in scored)
    assert any("get_weather" in r["tool_calls"] and "San Francisco" in r["tool_calls"] for r in scored)
    assert {r["reward"] for r in scored} == {0.0, 1.0}
    assert "8 of 10 planned rollouts scored (2 failed)" in run.notes


def test_live_rollouts_make_one_table_artifact_per_run_not_one_per_call(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    with live_run({"exporters": {"wandb": wandb_section(tmp_path)}}, out) as live:
        for call in range(20):
            live.export_rollouts([{"id": call, "reward": 1.0}])
        live.flush(60)
    [run] = offline_runs(tmp_path / "wb")
    # NeMo Gym's own Rollouts table (what the drop-in keeps) once for the run, not once per call
    tables = [a for a in run.artifacts if a.get("type") == "run_table" and a.get("name", "").endswith("-Rollouts")]
    assert len(tables) == 1, [a.get("name") for a in tables]
    table = json.loads(run.file(run.summary["rollouts"]["path"]).read_text())
    assert len(table["data"]) == 20
