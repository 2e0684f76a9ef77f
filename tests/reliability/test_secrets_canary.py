"""Secrets canary: distinct canary values in every secret-shaped place of a config, exported live
and post-run to every backend; then every byte the backends stored, every receipt, marker, log
line and the process environment are scanned: no canary anywhere."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts.live import live_exporters
from tests.mlflow_server import MlflowServer

REPO = Path(__file__).resolve().parents[2]
CANARIES = {
    "env": "canary-env-secret-0a1b2c9z",
    "api_key": "canary-api-key-3d4e5f8y",
    "token": "canary-hf-token-6a7b8c7x",
    "password": "canary-password-9d0e1f6w",
    "uri": "canary-uri-pass-2a3b4c5v",
    "header": "canary-header-5d6e7f4u",
    "wandb": "canary-wandb-key-8a9b0c3t",
    "mlflow_token": "canary-mlflow-token-1d2e2s",
    "aws": "canary-aws-secret-4a5b6c1r",
    "nested_list": "canary-list-secret-7d8e0q",
}


def canary_config(tmp_path: Path, server_uri: str) -> str:
    c = CANARIES
    return f"""
policy_model_name: canary-policy
policy_api_key: ${{oc.env:CANARY_POLICY_KEY}}
judge:
  api_key: {c["api_key"]}
  url: https://judge:{c["uri"]}@judge.example/v1
  headers:
    Authorization: Bearer {c["header"]}
hf_token: {c["token"]}
db:
  password: {c["password"]}
aws_secret_access_key: {c["aws"]}
servers:
  - name: a
    credentials: [{c["nested_list"]}]
exporters:
  local: {{enabled: true, root: {tmp_path / "local"}}}
  mlflow: {{enabled: true, tracking_uri: "{server_uri}", tracking_token: {c["mlflow_token"]}, experiment_name: canary}}
  wandb: {{enabled: true, mode: offline, project: canary, dir: {tmp_path / "wb"}, api_key: {c["wandb"]}}}
"""


def test_no_canary_reaches_any_backend_log_or_environment(
    quickstart_run: Path, tmp_path: Path, own_mlflow_server: MlflowServer,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    server = own_mlflow_server.start()
    monkeypatch.setenv("CANARY_POLICY_KEY", CANARIES["env"])
    environ_before = dict(os.environ)
    config_text = canary_config(tmp_path, server.uri)
    saved = quickstart_run.with_name("eval_config.yaml")
    saved.write_text(config_text)
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    # live, from the eval's side
    live_out = tmp_path / "live" / "eval.jsonl"
    live_out.parent.mkdir()
    with live_exporters(OmegaConf.create(config_text), live_out) as live:
        for step in range(5):
            live.export_metrics({"reward": step / 5}, step=step)
        live.export_rollouts([{"id": 1}])
        live.complete()
    assert all(r.lost == 0 and r.setup_error is None for r in live.reports), [
        r.describe() for r in live.reports
    ]
    # post-run, with the CLI (the run's saved config routes it to all three backends)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = subprocess.run([sys.executable, "-m", "gym_artifacts.cli", "-v", "export", str(quickstart_run), "--json"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count('"EXPORTED"') == 3
    server.stop()
    scanned: list[tuple[str, bytes]] = []
    roots = [tmp_path / "local", tmp_path / "wb", server.root, quickstart_run.parent, live_out.parent]
    roots += [
        Path(os.environ[v]) for v in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")
    ]
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and p != saved:  # the eval's own saved config is the user's file
                scanned.append((str(p), p.read_bytes()))
    scanned.append(("cli stdout+stderr", (proc.stdout + proc.stderr).encode()))
    scanned.append(("log records", "\n".join(r.getMessage() for r in caplog.records).encode()))
    captured = capfd.readouterr()
    scanned.append(("test stdout+stderr", (captured.out + captured.err).encode()))
    assert len(scanned) > 40
    kinds = {"receipt": 0, "marker": 0, "mlflow db": 0, "wandb": 0}
    for name, data in scanned:
        for label, canary in CANARIES.items():
            assert canary.encode() not in data, f"{label} canary found in {name}"
        kinds["receipt"] += name.endswith("_export_done.json")
        kinds["marker"] += name.endswith("_run_id")
        kinds["mlflow db"] += name.endswith("server.db")
        kinds["wandb"] += name.endswith(".wandb")
    assert (
        kinds["receipt"] == 3 and kinds["marker"] == 3 and kinds["mlflow db"] == 1 and kinds["wandb"] >= 2
    ), kinds
    # never written to the process environment
    added = {k: v for k, v in os.environ.items() if environ_before.get(k) != v}
    for value in added.values():
        assert not any(c in value for c in CANARIES.values())
    assert not any(c in v for c in CANARIES.values() if c != CANARIES["env"] for v in os.environ.values())
