"""The MLflow backend against the SQLite store and a real ``mlflow server``, read back with MlflowClient."""

from __future__ import annotations

import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters._mlflow_mapping import (
    config_params,
    sanitize_key,
    split_metrics,
    unique_names,
)
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live import live_run
from gym_artifacts.run.artifacts import RunArtifacts
from tests.load import scaled
from tests.mlflow_server import MlflowServer, free_port
from tests.mlflow_store import mlflow_sqlite
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
TOKEN = "mlflow-token-canary-5b8e1d"
API_KEY = "sk-api-key-canary-77c0aa"


def mlflow_cfg(uri: str, **extra: Any) -> Any:
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": "tests", **extra}
    return OmegaConf.create({"exporters": {"mlflow": section}})


def download(client: MlflowClient, run_id: str, path: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, path, str(dest)))


def test_post_run_export_reads_back(quickstart_run: Path, tracking_uri: str, tmp_path: Path) -> None:
    [result] = export_run(quickstart_run, mlflow_cfg(tracking_uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.rows == 300
    client = MlflowClient(tracking_uri)
    run = client.get_run(result.backend_run_id)
    assert run.info.status == "FINISHED"
    # params: the masked config, flattened
    assert run.data.params["policy_model_name"] == "quickstart-policy"
    assert run.data.params["policy_api_key"] == "***"
    assert run.data.params["num_repeats"] == "4"
    # tags: the run's identity
    identity = bookkeeping_of(run.data.tags)["identity"]
    assert identity.startswith("b3:")
    # headline metrics under NeMo Gym's own exporter's names (at most 12: MLflow's runs list), the
    # other statistics in the metrics table; levels as table artifacts
    agg = json.loads(quickstart_run.with_name("eval_aggregate_metrics.json").read_text())
    journal_series = {"train/reward", "rollouts_done"}  # the live step metrics, their own series
    assert len(set(run.data.metrics) - journal_series) <= 12, sorted(run.data.metrics)
    assert run.data.metrics["travel_simple_agent/mean/reward"] == pytest.approx(agg[1]["key_metrics"]["mean/reward"])
    table = json.loads(download(client, run.info.run_id, "tables/metrics.json", tmp_path / "m").read_text())
    assert dict(table["data"])["calendar_simple_agent/std/total_tokens"] == pytest.approx(
        agg[2]["agent_metrics"]["std/total_tokens"]
    )
    assert run.data.tags["weather_simple_agent/_ng_environment_server"] == "weather_environment_server"
    assert not any("level_metrics" in k or "rollout_infos" in k for k in [*run.data.metrics, *run.data.tags])
    assert run.data.metrics["coverage/expected"] == run.data.metrics["coverage/scored"] == 300
    assert json.loads(run.data.tags["mlflow.loggedArtifacts"]) == [
        {"path": "tables/group_level_metrics.json", "type": "table"},
        {"path": "tables/repeat_level_metrics.json", "type": "table"},
        {"path": "tables/metrics.json", "type": "table"},
        {"path": "rollouts.json", "type": "table"},  # NeMo Gym's rollouts table (test_nemo_gym_dropin)
    ]
    groups = json.loads(
        download(client, run.info.run_id, "tables/group_level_metrics.json", tmp_path / "t").read_text()
    )
    assert groups["columns"][:2] == ["agent", "_ng_task_index"] and len(groups["data"]) == 75
    assert run.data.metrics["omitted_rows"] == 0
    # the journal with original steps and timestamps
    journal = [json.loads(x) for x in quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()]
    history = client.get_metric_history(result.backend_run_id, "train/reward")
    assert [(m.step, m.timestamp, m.value) for m in history] == [
        (j["step"], int(j["time"] * 1000), j["metrics"]["train/reward"]) for j in journal
    ]
    # the NVML summary said "no samples": a tag with the reason, no zero metrics
    assert "NVML unavailable" in bookkeeping_of(run.data.tags)["nvml"]
    assert not any(k.startswith("system/") for k in run.data.metrics)
    # artifacts, byte-identical
    out = tmp_path / "dl"
    assert (
        download(client, run.info.run_id, "rollouts/rollouts.jsonl", out / "r").read_bytes()
        == quickstart_run.read_bytes()
    )
    for name in ("recording.mp4", "profile.pt.trace.json.gz", "session_times.json"):
        local = quickstart_run.with_name("eval_artifacts") / name
        assert (
            download(client, run.info.run_id, f"runtime/{name}", out / name).read_bytes()
            == local.read_bytes()
        )
    config_json = json.loads(download(client, run.info.run_id, "config.json", out / "c").read_text())
    assert config_json["policy_api_key"] == "***"


@pytest.mark.slow
def test_reexport_is_skipped_without_contact(quickstart_run: Path, tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    [first] = export_run(quickstart_run, mlflow_cfg(uri))
    assert first.status is ExportStatus.EXPORTED
    (tmp_path / "m.db").rename(tmp_path / "moved.db")  # a contact would create a fresh store here
    started = time.monotonic()
    [again] = export_run(quickstart_run, mlflow_cfg(uri))
    assert again.status is ExportStatus.SKIPPED
    assert again.backend_run_id == first.backend_run_id
    assert time.monotonic() - started < scaled(5) and not (tmp_path / "m.db").exists()
    # Another destination is not covered by that receipt: it is sent to (and fails, being closed).
    closed = f"http://127.0.0.1:{free_port()}"
    [elsewhere] = export_run(quickstart_run, mlflow_cfg(closed, export_request_retries=0))
    assert elsewhere.status is ExportStatus.FAILED and "Connection refused" in (elsewhere.reason or "")


@pytest.mark.slow
def test_nvml_series_as_system_metrics(quickstart_run: Path, tmp_path: Path) -> None:
    artifacts = quickstart_run.with_name("eval_artifacts")
    (artifacts / "metrics_summary.json").write_text(
        json.dumps({"samples": 2, "gpus": {"0": {"gpu_util_pct": {"avg": 80.0, "peak": 85.0}}}})
    )
    samples = [
        {
            "time": 1764525600.0 + i,
            "gpu": 0,
            "metrics": {"gpu_util_pct": 75 + 10 * i, "memory_used_gb": 40 + 2 * i},
        }
        for i in range(2)
    ]
    (artifacts / "nvml_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    uri = mlflow_sqlite(tmp_path / 'm.db')
    [result] = export_run(quickstart_run, mlflow_cfg(uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(uri)
    run = client.get_run(result.backend_run_id)
    assert run.data.metrics["system/gpus/0/gpu_util_pct/peak"] == 85.0
    history = client.get_metric_history(result.backend_run_id, "system/gpu0/gpu_util_pct")
    assert [(m.step, m.timestamp, m.value) for m in history] == [
        (0, 1764525600000, 75.0),
        (1, 1764525601000, 85.0),
    ]


@pytest.mark.slow
def test_export_killed_after_run_creation_leaves_one_run(quickstart_run: Path, tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from gym_artifacts._builtin_exporters import _mlflow_client
        original = _mlflow_client.ScopedMlflow.log_artifact
        def die(self, *a, **k):  # the run exists and its metrics are in: now die
            os.kill(os.getpid(), signal.SIGKILL)
        _mlflow_client.ScopedMlflow.log_artifact = die
        from gym_artifacts.cli import main
        sys.exit(main(["export", {str(quickstart_run)!r}, "-e", "mlflow",
                       "exporters.mlflow.tracking_uri={uri}", "exporters.mlflow.experiment_name=tests"]))
        """
    )
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    run = RunArtifacts.from_path(quickstart_run)
    assert not run.export_done_fpath("mlflow").exists()
    [result] = export_run(run, mlflow_cfg(uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id])
    identity = bookkeeping_of(client.get_run(result.backend_run_id).data.tags)["identity"]
    assert [r.info.run_id for r in runs if bookkeeping_of(r.data.tags).get("identity") == identity] == [
        result.backend_run_id
    ]
    history = client.get_metric_history(result.backend_run_id, "train/reward")
    assert len(history) == 20 and len({(m.step, m.timestamp) for m in history}) == 20


def test_live_run_then_certify(quickstart_run: Path, tracking_uri: str, tmp_path: Path) -> None:
    out = tmp_path / "live" / "eval.jsonl"
    out.parent.mkdir()
    cfg = {"exporters": {"mlflow": {"enabled": True, "tracking_uri": tracking_uri, "experiment_name": "tests"}},
           "policy_api_key": API_KEY, "resume": True}  # fmt: skip
    with live_run(cfg, out, teardown_timeout=120) as live:  # a fresh SQLite store is slow
        for step in range(10):
            live.export_metrics(
                {"reward": step / 10, "pass@1": 0.5, "phase": "warmup" if step < 5 else "main"}, step=step
            )
        live.export_rollouts([{"id": i} for i in range(3)])
        out.write_text(quickstart_run.read_text())
        out.with_name("eval_aggregate_metrics.json").write_text(
            quickstart_run.with_name("eval_aggregate_metrics.json").read_text()
        )
        live.complete()
    [report] = live.reports
    assert report.lost == 0, report.describe()
    client = MlflowClient(tracking_uri)
    run = client.get_run(report.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["policy_api_key"] == "***"
    assert [m.step for m in client.get_metric_history(report.run_id, "reward")] == list(range(10))
    assert run.data.metrics["pass_at_1"] == 0.5
    assert run.data.tags["phase"] == "main"
    [result] = export_run(out, OmegaConf.create(cfg), certify=True)
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert result.backend_run_id == report.run_id
    run = client.get_run(report.run_id)
    assert bookkeeping_of(run.data.tags)["certified"] == "true"
    assert "travel_simple_agent/mean/reward" in run.data.metrics
    assert len(client.get_metric_history(report.run_id, "reward")) == 10  # nothing duplicated


@pytest.mark.slow
def test_resume_reopens_the_marker_run(tmp_path: Path) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    out = tmp_path / "eval.jsonl"
    cfg = {
        "exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "tests"}},
        "resume": True,
    }
    with pytest.raises(RuntimeError), live_run(cfg, out) as live:
        live.export_metrics({"loss": 1.0}, step=0)
        raise RuntimeError("preempted")
    run_id = live.reports[0].run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FAILED"
    with live_run(cfg, out) as live:
        live.flush(30)
        assert client.get_run(run_id).info.status == "RUNNING"
        live.export_metrics({"loss": 0.5}, step=1)
    assert live.reports[0].run_id == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1]


def test_server_killed_mid_run(quickstart_run: Path, own_mlflow_server: MlflowServer, tmp_path: Path) -> None:
    server = own_mlflow_server.start()
    out = tmp_path / "eval.jsonl"
    cfg = {"exporters": {"mlflow": {"enabled": True, "tracking_uri": server.uri, "experiment_name": "tests"}}}
    before, after = [], []
    started = time.monotonic()
    with live_run(cfg, out, teardown_timeout=5.0) as live:
        for step in range(300):
            t0 = time.perf_counter()
            live.export_metrics({"reward": step}, step=step)
            before.append(time.perf_counter() - t0)
        live.flush(30)
        server.stop()
        for step in range(300, 600):
            t0 = time.perf_counter()
            live.export_metrics({"reward": step}, step=step)
            after.append(time.perf_counter() - t0)
        # the eval goes on: give the worker time to notice the outage
        time.sleep(1.0)
        stop_started = time.monotonic()
    teardown_seconds = time.monotonic() - stop_started
    assert statistics.median(after) < 100e-6 and statistics.median(before) < 100e-6
    assert teardown_seconds < 5.0 + scaled(1.0)
    [report] = live.reports
    assert report.failed + report.undelivered + report.dropped > 0
    assert time.monotonic() - started < 60
    # The journal holds every step: after a restart, the post-run export completes the run.
    for i, name in enumerate(["eval.jsonl", "eval_aggregate_metrics.json"]):
        (out.parent / name).write_bytes((quickstart_run.parent / name).read_bytes())
        os.utime(out.parent / name, (1e9 + i, 1e9 + i))
    server.start()
    [result] = export_run(out, mlflow_cfg(server.uri))
    assert result.status is ExportStatus.EXPORTED, result.reason
    history = MlflowClient(server.uri).get_metric_history(result.backend_run_id, "reward")
    assert [m.step for m in history] == list(range(600))


def test_secrets_appear_nowhere_in_the_server(
    quickstart_run: Path, own_mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = own_mlflow_server.start()
    monkeypatch.setenv("POLICY_API_KEY", API_KEY)
    config = quickstart_run.with_name("eval_config.yaml")
    config.write_text(
        config.read_text()
        + f"mlflow_tracking_uri: {server.uri}\nmlflow_tracking_token: {TOKEN}\nmlflow_experiment_name: tests\n"
    )
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    out = tmp_path / "live.jsonl"
    live_cfg = OmegaConf.load(config)
    with live_run(live_cfg, out) as live:
        live.export_metrics({"x": 1}, step=0)
    assert live.reports[0].lost == 0, live.reports[0].describe()
    proc = run_bounded([sys.executable, "-m", "gym_artifacts.cli", "export", str(quickstart_run), "--json", "-e", "mlflow"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["status"] == "EXPORTED"
    assert TOKEN not in proc.stdout + proc.stderr and API_KEY not in proc.stdout + proc.stderr
    assert os.environ.get("MLFLOW_TRACKING_TOKEN") is None
    server.stop()
    scanned = [server.db, server.log, *[p for p in server.artifacts.rglob("*") if p.is_file()]]
    assert len(scanned) > 5
    for path in scanned:
        data = path.read_bytes()
        assert TOKEN.encode() not in data, path
        assert API_KEY.encode() not in data, path


def test_key_sanitising() -> None:
    assert sanitize_key("pass@1") == "pass_at_1"
    assert sanitize_key("a.b[0].c") == "a.b_0_.c"  # NeMo Gym's names (tests/test_nemo_gym_dropin.py)
    assert sanitize_key("weird key!*?") == "weird key___"
    assert sanitize_key("/a//b/") == "a/b"
    assert sanitize_key("../up") == "__/up"
    assert sanitize_key("//") is None
    long = sanitize_key("k" * 400)
    assert long is not None and len(long) == 250
    names = unique_names(["a!b", "a?b", "a_b", "/"])
    assert len(set(names.values())) == 3 and "/" not in names
    assert config_params({"x": {"y": [1, {"z": "s"}]}, "flag": True}) == {
        "x.y_0_": "1",
        "x.y_1_.z": "s",
        "flag": "True",
    }
    import numpy as np

    metrics, tags = split_metrics(
        {
            "np": np.float32(0.5),
            "i": np.int64(3),
            "b": np.bool_(True),
            "t": True,
            "nan": float("nan"),
            "s": "text",
            "n": None,
        }
    )
    assert metrics["np"] == 0.5 and metrics["i"] == 3.0 and metrics["b"] == 1.0 and metrics["t"] == 1.0
    assert metrics["nan"] != metrics["nan"]
    assert tags == {"s": "text"}


def test_split_metrics_keeps_integers_past_float_precision_exact_as_tags() -> None:
    import numpy as np

    metrics, tags = split_metrics(
        {"big": 2**64, "neg": -(2**70), "np": np.int64(2**60 + 1), "edge": 2**53, "f": 1e300}
    )
    assert metrics == {
        "big": float(2**64),
        "neg": float(-(2**70)),
        "np": float(2**60),
        "edge": float(2**53),
        "f": 1e300,
    }
    assert tags == {
        "big": str(2**64),
        "neg": str(-(2**70)),
        "np": str(2**60 + 1),
    }  # exact digits beside the float
