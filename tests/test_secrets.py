"""Secret masking: whole name parts, URI credentials, repeated values; nothing leaks to disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.core.secrets import MASK, collect_secret_values, is_secret_key, mask_secrets, redact_text


@pytest.mark.parametrize(
    "key",
    ["api_key", "wandb_api_key", "WANDB_API_KEY", "wandbApiKey", "HF_TOKEN", "tracking_token",
     "password", "db-password", "client_secret", "credentials", "auth", "Authorization",
     "headers", "private_key", "aws_access_key_id", "secret", "apikey", "cookie"],
)  # fmt: skip
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["key_metrics", "monkey", "key", "max_tokens", "pad_token", "eos_token", "num_tokens",
     "token_ids", "keyboard", "author", "passage", "secretary_name", "tokenizer", "primary_key_col"],
)  # fmt: skip
def test_not_secret_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_mask_nested_uri_and_repeated_values() -> None:
    cfg = {
        "wandb_api_key": "wk-abcdef123456",
        "db": {"url": "postgresql://alice:s3cr3t-pw@db:5432/evals", "password": "s3cr3t-pw"},
        "headers": {"X-Api": "abc"},
        "key_metrics": {"pass@1": 0.5},
        "copy_of_key": "wk-abcdef123456",
        "cmd": "curl -H 'Authorization: Bearer wk-abcdef123456' https://x",
        "endpoint": "https://x/v1?api_key=qqq&limit=3",
        "empty_token": None,
        "list": [{"token": "t-1234567890"}, "t-1234567890"],
    }
    masked = mask_secrets(cfg)
    assert masked["wandb_api_key"] == MASK
    assert masked["db"]["url"] == f"postgresql://alice:{MASK}@db:5432/evals"
    assert masked["db"]["password"] == MASK
    assert masked["headers"] == MASK
    assert masked["key_metrics"] == {"pass@1": 0.5}
    assert masked["copy_of_key"] == MASK
    assert "wk-abcdef123456" not in masked["cmd"]
    assert masked["endpoint"] == f"https://x/v1?api_key={MASK}&limit=3"
    assert masked["empty_token"] is None
    assert masked["list"] == [{"token": MASK}, MASK]
    assert cfg["wandb_api_key"] == "wk-abcdef123456"  # input untouched


def test_redact_text() -> None:
    assert redact_text("failed with key sk-live-123456 at https://u:p4ss@h", {"sk-live-123456"}) == (
        f"failed with key {MASK} at https://u:{MASK}@h"
    )


def test_secret_appears_in_no_file_the_local_backend_wrote(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary_env = "sk-canary-from-env-7f3a9c"
    canary_literal = "literal-canary-password-91b2"
    monkeypatch.setenv("POLICY_API_KEY", canary_env)
    config = quickstart_run.with_name("eval_config.yaml")
    config.write_text(
        config.read_text()
        + f"judge:\n  password: {canary_literal}\n  url: https://judge:{canary_literal}@judge.local\n"
    )
    derived = quickstart_run.with_name("eval_artifacts") / "derived_config.json"
    derived.write_text(f'{{"model": "m", "api_key": "{canary_env}"}}')
    agg = quickstart_run.with_name("eval_aggregate_metrics.json")
    agg.touch()
    store = tmp_path / "store"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    written = [p for p in store.rglob("*") if p.is_file()]
    written += list(quickstart_run.parent.glob("*_export_done.json"))
    assert any(p.name == "config.json" for p in written)
    for p in written:
        data = p.read_bytes()
        assert canary_env.encode() not in data, p
        assert canary_literal.encode() not in data, p
    config_json = next(p for p in written if p.name == "config.json").read_text()
    assert '"policy_api_key":"***"' in config_json


# --- value-based detection: secrets whose key name gives nothing away -----------------------------

CANARY = "Zq7canaryVALUE9x"


@pytest.mark.parametrize(
    "key",
    ["api_keys", "openai_key", "wandb_key", "Ocp-Apim-Subscription-Key", "hf_tokens", "passwords",
     "anthropic_api_keys", "x-api-key"],
)  # fmt: skip
def test_plural_and_unlisted_secret_keys(key: str) -> None:
    assert is_secret_key(key)
    assert CANARY not in str(mask_secrets({key: [CANARY]}))


@pytest.mark.parametrize(
    "key", ["sort_key", "primary_key", "cache_key", "group_key", "tokens", "num_keys", "keys", "keyword"]
)
def test_ordinary_key_names_stay_visible(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    "value",
    [
        f"https://bucket.s3.amazonaws.com/o?X-Amz-Date=1&X-Amz-Signature={CANARY}",
        f"https://storage.googleapis.com/b/o?X-Goog-Signature={CANARY}&x=1",
        f"https://acct.blob.core.windows.net/c/b?sv=2020&sig={CANARY}",
        f"https://h/api?signature={CANARY}",
        f"https://maps.example/api?key={CANARY}",
        f"https://fn.azurewebsites.net/api/f?code={CANARY}",
        f"https://app.example/callback#access_token={CANARY}&token_type=bearer",
        f"https://{CANARY}@github.com/org/repo.git",
        f"postgresql://user:p@ss{CANARY}@db:5432/x",
        f"--api-key={CANARY}",
        f"--password={CANARY}",
        f"python eval.py --api-key {CANARY} --n 3",
        f"sk-proj-{CANARY}abcd",
        f"hf_{CANARY}abcdefgh",
        f"ghp_{CANARY}abcdefghijklmnop",
        f"github_pat_11AB{CANARY}_abcdef",
        f"xoxb-1234-{CANARY}",
        "AKIAIOSFODNN7EXAMPLE",
        f"Bearer {CANARY}",
        f"curl -H 'Authorization: Bearer {CANARY}' https://x",
        f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.{CANARY}",
        f"export API_KEY={CANARY}",
    ],
)
def test_secret_values_masked_under_ordinary_keys(value: str) -> None:
    masked = mask_secrets({"endpoint": value, "cmd": [value]})
    secret = "AKIAIOSFODNN7EXAMPLE" if value.startswith("AKIA") else CANARY
    assert secret not in str(masked), masked
    assert secret not in redact_text(f"failed: {value}", ()), value


def test_cli_style_lists_and_header_lists() -> None:
    cfg = {
        "argv": ["eval", "--api-key", CANARY, "--n", "3"],
        "http_options": [{"name": "x-api-key", "value": CANARY + "1"}, {"name": "Accept", "value": "json"}],
        "plain": "the quick brown fox",
    }
    masked = mask_secrets(cfg)
    assert masked["argv"] == ["eval", "--api-key", MASK, "--n", "3"]
    assert masked["http_options"] == [{"name": "x-api-key", "value": MASK}, {"name": "Accept", "value": "json"}]
    assert masked["plain"] == "the quick brown fox"
    # values found by shape are known secrets everywhere else too
    found = collect_secret_values(cfg)
    assert {CANARY, CANARY + "1"} <= found


def test_ordinary_values_are_not_masked() -> None:
    cfg = {
        "url": "https://git@github.com/org/repo.git?ref=main#readme",
        "model": "skorch-model",
        "path": "/data/hf_datasets/x",
        "cmd": ["--n", "3", "--model", "gpt"],
        "k": "key=value",
    }
    assert mask_secrets(cfg) == cfg


def test_env_interpolation_under_ordinary_key_logged_unresolved(monkeypatch: pytest.MonkeyPatch) -> None:
    from gym_artifacts.run.run_config import backend_config

    monkeypatch.setenv("SOME_VAR", CANARY)
    monkeypatch.setenv("MODEL_VAR", "my-model")
    cfg = OmegaConf.create(
        {"endpoint": "${oc.env:SOME_VAR}", "judge": {"model_name": "${oc.env:MODEL_VAR}"}, "note": "x-${oc.env:SOME_VAR}"}
    )
    shown, secrets = backend_config(cfg)
    assert shown["endpoint"] == "${oc.env:SOME_VAR}"
    assert shown["note"] == "x-${oc.env:SOME_VAR}"
    assert shown["judge"]["model_name"] == "my-model"  # a known-safe key shows its value
    assert CANARY in secrets


def test_redacting_log_records(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from gym_artifacts.core.secrets import install_log_redaction, remember_secrets

    install_log_redaction()
    remember_secrets({"plainsecretvalue123"})
    logging.getLogger("some.thirdparty").warning("uri http://u:%s@h and %s", CANARY, "plainsecretvalue123")
    logging.getLogger("gym_artifacts.x").warning("token sk-%s", CANARY + "abcdef")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "some.thirdparty" in caplog.text or text
    assert CANARY not in text and "plainsecretvalue123" not in text, text
    assert CANARY not in caplog.text and "plainsecretvalue123" not in caplog.text


def test_yaml_runtime_artifact_masked_like_json(quickstart_run: Path, tmp_path: Path) -> None:
    artifacts = quickstart_run.with_name("eval_artifacts")
    (artifacts / "server_config.yaml").write_text(
        f"model: m\nopenai_key: {CANARY}\nurl: https://u:{CANARY}2@h/x\nargv: [--api-key, {CANARY}3]\n"
    )
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    store = tmp_path / "store"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    [shipped] = store.rglob("server_config.yaml")
    text = shipped.read_text()
    assert CANARY not in text and "model: m" in text, text


# LLM usage counters are named after tokens; none of them is a credential.
@pytest.mark.parametrize(
    "key",
    ["completion_tokens", "prompt_tokens", "reasoning_tokens", "cached_tokens", "model_call_zero_completion_tokens",
     "model_call_missing_token_counts", "rollout_token_count_mismatch", "generated_tokens", "response_tokens"],
)
def test_token_counters_stay_visible(key: str) -> None:
    assert not is_secret_key(key)


def test_numbers_under_secret_keys_do_not_mask_equal_numbers_elsewhere() -> None:
    """A short or numeric secret is masked where it sits, never by equality across the document:
    otherwise every 0 and 10 of a metrics file would become ``***``."""
    doc = {"auth_retry": {"evaluated": 10, "ignored": 0}, "records": 10, "missing": 0,
           "password": "hunter2-long", "note": "hunter2-long again", "pin_password": 1234}
    masked = mask_secrets(doc)
    assert masked["records"] == 10 and masked["missing"] == 0
    assert masked["auth_retry"] == MASK and masked["pin_password"] == MASK  # masked where they sit
    assert masked["note"] == "*** again"  # a real secret string is still masked everywhere
    assert "10" not in collect_secret_values(doc) and "0" not in collect_secret_values(doc)


def test_nemo_gym_quality_summary_keeps_its_numbers() -> None:
    import json

    from tests.fixture_paths import NEMO_GYM_FIXTURES

    fixture = NEMO_GYM_FIXTURES / "clean" / "quality_summary.json"
    doc = json.loads(fixture.read_text())
    assert mask_secrets(doc) == doc
