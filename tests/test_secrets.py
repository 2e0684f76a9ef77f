"""Secret masking: whole name parts, URI credentials, repeated values; nothing leaks to disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts.export import export_run
from gym_artifacts.exporter import ExportStatus
from gym_artifacts.secrets import MASK, is_secret_key, mask_secrets, redact_text


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
