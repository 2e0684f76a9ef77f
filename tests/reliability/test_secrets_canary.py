"""Secrets canary: distinct canary values in every secret-shaped place of a config, exported live
and post-run to every backend; then every byte the backends stored, every receipt, marker, log
line and the process environment are scanned: no canary anywhere."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts.live import live_run
from tests.mlflow_server import MlflowServer
from tests.processes import run_bounded

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
    # found by shape or by an unlisted/plural name, under ordinary keys
    "plural": "canary-plural-keys-1p2q3r",
    "openai_key": "canary-openai-key-4s5t6u",
    "subscription": "canary-apim-subscr-7v8w9x",
    "sig": "canary-azure-sas-sig-0y1z2a",
    "amz": "canary-amz-signature-3b4c5d",
    "goog": "canary-goog-signature-6e7f8g",
    "query_key": "canary-query-key-9h0i1j",
    "query_code": "canary-query-code-2k3l4m",
    "fragment": "canary-fragment-token-5n6o7p",
    "url_user": "canaryUrlUserToken8q9r0s",
    "cli_list": "canary-cli-list-1t2u3v",
    "cli_eq": "canary-cli-equals-4w5x6y",
    "header_list": "canary-header-list-7z8a9b",
    "env_ordinary": "canary-env-ordinary-0c1d2e",
    "at_password": "canary-at-pass@word-3f4g5h",
    "sk": "sk-proj-canarySkShape6i7j8k",
    "hf": "hf_canaryHfShape9l0m1n2o",
    "ghp": "ghp_canaryGhpShape3p4q5r6s7t",
    "github_pat": "github_pat_11canaryPat_8u9v0w1x2y",
    "slack": "xoxb-1234-canarySlack-3z4a5b",
    "akia": "AKIACANARY0123456789",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.canaryJwtSig6c7d",
    "bearer": "canary-bearer-anywhere-8e9f0g",
    "mlflow_tag": "canary-mlflow-tag-1h2i3j",
    "uri_password": "canary-tracking-uri-pw-4k5l",
    "journal": "canary-journal-metric-6m7n8o",
    "yaml_artifact": "canary-yaml-artifact-9p0q1r",
    "live_metric": "canary-live-metric-2s3t4u",
    "json_artifact": "canary-json-artifact-5v6w7x",
    # issue 27: not plain ASCII, or holding a quote and a backslash (JSON and HTML escape them)
    "unicode": "canary-clé-sécrète-8y9z0a",
    "quoted": 'canary-quo"te\\back-1b2c3d',
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
unicode_api_key: "{c["unicode"]}"
quoted_password: {json.dumps(c["quoted"])}
db:
  password: {c["password"]}
aws_secret_access_key: {c["aws"]}
servers:
  - name: a
    credentials: [{c["nested_list"]}]
api_keys: [{c["plural"]}]
openai_key: {c["openai_key"]}
Ocp-Apim-Subscription-Key: {c["subscription"]}
storage:
  blob: "https://acct.blob.core.windows.net/c/b?sv=2020-01-01&sig={c["sig"]}"
  s3: "https://b.s3.amazonaws.com/o?X-Amz-Date=20260101&X-Amz-Signature={c["amz"]}"
  gcs: "https://storage.googleapis.com/b/o?X-Goog-Signature={c["goog"]}&X-Goog-Date=1"
  maps: "https://maps.example/api?key={c["query_key"]}&q=1"
  fn: "https://fn.azurewebsites.net/api/f?code={c["query_code"]}"
  callback: "https://app.example/cb#access_token={c["fragment"]}&token_type=bearer"
  repo: "https://{c["url_user"]}@github.com/org/repo.git"
  db: "postgresql://evals:{c["at_password"]}@db:5432/x"
launch:
  argv: [eval, --api-key, {c["cli_list"]}, --n, "3"]
  cmd: "python eval.py --password={c["cli_eq"]} --n 3"
  http: [{{name: x-api-key, value: {c["header_list"]}}}, {{name: Accept, value: json}}]
  endpoint: ${{oc.env:CANARY_ORDINARY}}
shapes:
  - {c["sk"]}
  - {c["hf"]}
  - {c["ghp"]}
  - {c["github_pat"]}
  - {c["slack"]}
  - {c["akia"]}
  - {c["jwt"]}
  - "curl -H 'X-Trace: 1' -H 'Authorization: Bearer {c["bearer"]}'"
exporters:
  local: {{enabled: true, root: {tmp_path / "local"}}}
  mlflow:
    enabled: true
    tracking_uri: "{server_uri}"
    tracking_token: {c["mlflow_token"]}
    experiment_name: canary
    tags: {{team_token: {c["mlflow_tag"]}, owner: evals}}
  wandb: {{enabled: true, mode: offline, project: canary, dir: {tmp_path / "wb"}, api_key: {c["wandb"]}}}
  tensorboard: {{enabled: true, logdir: {tmp_path / "tb"}}}
"""


def test_no_canary_reaches_any_backend_log_or_environment(
    quickstart_run: Path, tmp_path: Path, own_mlflow_server: MlflowServer,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    server = own_mlflow_server.start()
    monkeypatch.setenv("CANARY_POLICY_KEY", CANARIES["env"])
    monkeypatch.setenv("CANARY_ORDINARY", CANARIES["env_ordinary"])
    environ_before = dict(os.environ)
    # the tracking URI carries a password (the server does not check it; the client sends it)
    uri_with_password = server.uri.replace("http://", f"http://evals:{CANARIES['uri_password']}@")
    config_text = canary_config(tmp_path, uri_with_password)
    saved = quickstart_run.with_name("eval_config.yaml")
    saved.write_text(config_text)
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    # the user's own files: a journal metric named like a secret, a YAML runtime artifact
    journal = quickstart_run.with_name("eval_metrics.jsonl")
    with journal.open("a") as fh:
        fh.write(json.dumps({"step": 10_000, "time": 1.0, "metrics": {"api_key": CANARIES["journal"]}}) + "\n")
    yaml_artifact = quickstart_run.with_name("eval_artifacts") / "server_config.yaml"
    yaml_artifact.write_text(f"model: m\nopenai_key: {CANARIES['yaml_artifact']}\n")
    json_artifact = quickstart_run.with_name("eval_artifacts") / "server_config.json"
    json_artifact.write_text(json.dumps({"model": "m", "api_key": CANARIES["json_artifact"]}))
    # every other kind of file a backend ships: a config secret quoted in NeMo Gym's own output
    # (a sidecar, the aggregate metrics: masked by value, their keys are never secret names)
    sidecar = quickstart_run.with_name("eval_materialized_inputs.jsonl")
    first, rest = sidecar.read_text().split("\n", 1)
    sidecar.write_text(json.dumps({**json.loads(first), "judge": f"key={CANARIES['api_key']}"}) + "\n" + rest)
    aggregate = quickstart_run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(aggregate.read_text())
    entries[0]["judge_note"] = f"judged with {CANARIES['token']}, {CANARIES['unicode']}, {CANARIES['quoted']}"
    aggregate.write_text(json.dumps(entries))
    # the run's own saved config (live logging writes OUT_config.yaml as NeMo Gym does): the user's file
    user_files = {saved, journal, yaml_artifact, json_artifact, sidecar, aggregate}
    user_files.add(tmp_path / "live" / "eval_config.yaml")
    # live, from the eval's side
    live_out = tmp_path / "live" / "eval.jsonl"
    live_out.parent.mkdir()
    with live_run(OmegaConf.create(config_text), live_out, teardown_timeout=180) as live:
        for step in range(5):
            live.export_metrics({"reward": step / 5, "api_key": CANARIES["live_metric"]}, step=step)
        live.export_rollouts([{"id": 1}])
        live.complete()
    assert all(r.lost == 0 and r.setup_error is None for r in live.reports), [
        r.describe() for r in live.reports
    ]
    # post-run, with the CLI (the run's saved config routes it to all three backends)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    proc = run_bounded([sys.executable, "-m", "gym_artifacts.cli", "-v", "export", str(quickstart_run), "--json"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count('"EXPORTED"') == 4
    server.stop()
    scanned: list[tuple[str, bytes]] = []
    roots = [tmp_path / "local", tmp_path / "wb", tmp_path / "tb", server.root, quickstart_run.parent, live_out.parent]
    roots += [
        Path(os.environ[v]) for v in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")
    ]
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and p not in user_files:
                scanned.append((str(p), p.read_bytes()))
    scanned.append(("cli stdout+stderr", (proc.stdout + proc.stderr).encode()))
    scanned.append(("log records", "\n".join(r.getMessage() for r in caplog.records).encode()))
    captured = capfd.readouterr()
    scanned.append(("test stdout+stderr", (captured.out + captured.err).encode()))
    assert len(scanned) > 40
    kinds = {"receipt": 0, "marker": 0, "mlflow db": 0, "wandb": 0, "tfevents": 0}
    for name, data in scanned:
        for label, canary in CANARIES.items():
            for form in {canary, json.dumps(canary)[1:-1], json.dumps(canary, ensure_ascii=False)[1:-1]}:
                assert form.encode() not in data, f"{label} canary found in {name}"
        kinds["receipt"] += name.endswith("_export_done.json")
        kinds["marker"] += name.endswith("_run_id")
        kinds["mlflow db"] += name.endswith("server.db")
        kinds["wandb"] += name.endswith(".wandb")
        kinds["tfevents"] += "tfevents" in name
    assert (
        kinds["receipt"] == 4 and kinds["marker"] == 4 and kinds["mlflow db"] == 1 and kinds["wandb"] >= 2
        and kinds["tfevents"] >= 2
    ), kinds
    # never written to the process environment
    added = {k: v for k, v in os.environ.items() if environ_before.get(k) != v}
    for value in added.values():
        assert not any(c in value for c in CANARIES.values())
    set_by_test = {CANARIES["env"], CANARIES["env_ordinary"]}
    assert not any(c in v for c in CANARIES.values() if c not in set_by_test for v in os.environ.values())
