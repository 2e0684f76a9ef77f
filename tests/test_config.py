"""Config: flags read as the validated config reads them, NeMo Gym's flat keys, upload settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts._builtin_exporters.local import LocalSettings
from gym_artifacts.core.config import (
    build_export_config,
    enabled_exporters,
    exporter_section,
    load_yaml_config,
    normalize,
    parse_flag,
    parse_overrides,
    raw_container,
    resolve_upload_rollouts,
    validate_settings,
)
from gym_artifacts.core.errors import ConfigError
from tests.conftest import copy_quickstart


@pytest.mark.parametrize("text", ["false", "False", "0", "no", "off", " NO ", "n", False, 0])
def test_false_flags(text: object) -> None:
    assert parse_flag(text, "k") is False


@pytest.mark.parametrize("text", ["true", "1", "yes", "on", "Y", True, 1])
def test_true_flags(text: object) -> None:
    assert parse_flag(text, "k") is True


def test_bad_flag_names_key() -> None:
    with pytest.raises(ConfigError, match=r"exporters\.local\.enabled: 'maybe' is not a boolean"):
        parse_flag("maybe", "exporters.local.enabled")


def test_enabled_flag_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = OmegaConf.create(
        {
            "exporters": {
                "local": {"enabled": "${oc.env:USE_LOCAL,true}"},
                "mlflow": {"enabled": "${oc.env:USE_MLFLOW}"},
            }
        }
    )
    monkeypatch.setenv("USE_MLFLOW", "no")
    assert enabled_exporters(cfg) == ["local"]
    monkeypatch.setenv("USE_LOCAL", "0")
    monkeypatch.setenv("USE_MLFLOW", "1")
    assert enabled_exporters(cfg) == ["mlflow"]


def test_flat_nemo_gym_keys_map_and_enable() -> None:
    cfg = normalize(OmegaConf.create({
        "wandb_project": "proj", "wandb_name": "run-1", "wandb_api_key": "${oc.env:WANDB_API_KEY}",
        "mlflow_tracking_uri": "http://127.0.0.1:5000", "mlflow_experiment_name": "exp",
        "mlflow_run_name": "r", "mlflow_tracking_token": "tok",
    }))  # fmt: skip
    raw = raw_container(cfg)["exporters"]
    assert raw["wandb"] == {
        "project": "proj",
        "name": "run-1",
        "api_key": "${oc.env:WANDB_API_KEY}",
        "enabled": True,
    }
    assert raw["mlflow"]["tracking_uri"] == "http://127.0.0.1:5000"
    assert raw["mlflow"]["tracking_token"] == "tok"
    assert enabled_exporters(cfg) == ["mlflow", "wandb"]


def test_explicit_section_wins_over_flat_keys() -> None:
    cfg = normalize(OmegaConf.create({
        "wandb_project": "flat", "exporters": {"wandb": {"project": "nested", "enabled": False}},
    }))  # fmt: skip
    assert raw_container(cfg)["exporters"]["wandb"] == {"project": "nested", "enabled": False}
    assert enabled_exporters(cfg) == []


def test_canonical_upload_key_wins_and_deprecated_is_never_evaluated() -> None:
    # Evaluating the deprecated key would raise: the environment variable does not exist.
    cfg = OmegaConf.create({"upload_rollouts": "no", "upload_rollouts_to_wandb": "${oc.env:GONE_FOREVER}"})
    assert resolve_upload_rollouts(None, cfg) is False


def test_deprecated_upload_key_used_alone() -> None:
    assert resolve_upload_rollouts(None, OmegaConf.create({"upload_rollouts_to_wandb": "false"})) is False
    assert resolve_upload_rollouts(None, OmegaConf.create({"upload_rollouts_to_wandb": True})) is True


def test_explicit_upload_wins_over_saved() -> None:
    saved = OmegaConf.create({"upload_rollouts": False})
    assert resolve_upload_rollouts(True, saved) is True
    assert resolve_upload_rollouts(None, saved, OmegaConf.create({"upload_rollouts": True})) is False
    assert resolve_upload_rollouts(None, OmegaConf.create({}), None) is True


def test_upload_settings_resolved_alone() -> None:
    cfg = OmegaConf.create({"other": "${oc.env:GONE_FOREVER}", "upload_rollouts": "${flag}", "flag": "0"})
    assert resolve_upload_rollouts(None, cfg) is False


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    fpath = tmp_path / "bad.yaml"
    fpath.write_text("exporters:\n  local:\n    enabled: true\n   root: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:4:\d+: invalid YAML"):
        load_yaml_config(fpath)


def test_non_mapping_yaml_is_refused(tmp_path: Path) -> None:
    fpath = tmp_path / "list.yaml"
    fpath.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_yaml_config(fpath)


def test_invalid_backend_setting_names_key_and_why() -> None:
    with pytest.raises(ConfigError, match=r"exporters\.local\.experiment: .*plain folder name"):
        validate_settings(LocalSettings, {"enabled": True, "experiment": "../up"}, "local")
    with pytest.raises(
        ConfigError,
        match=r"exporters\.local\.rooot: unknown setting; did you mean 'root'\? \(known: enabled, experiment, report, root\)",
    ):
        validate_settings(LocalSettings, {"rooot": "x"}, "local")


def test_overrides_apply_last_and_malformed_is_named() -> None:
    cfg, source = build_export_config(
        None, None, ["exporters.local.root=/tmp/x", "exporters.mlflow.enabled=false"]
    )
    assert source == "embedded default"
    assert exporter_section(cfg, "local")["root"] == "/tmp/x"
    assert enabled_exporters(cfg) == ["local"]
    with pytest.raises(ConfigError, match="'novalue': expected key=value"):
        parse_overrides(["novalue"])


def test_saved_run_config_used_only_when_it_configures_exporters(tmp_path: Path) -> None:
    plain = OmegaConf.create({"policy_model_name": "x"})
    _, source = build_export_config(None, plain, [])
    assert source == "embedded default"
    routed = OmegaConf.create({"mlflow_tracking_uri": "sqlite:///elsewhere.db"})
    cfg, source = build_export_config(None, routed, [])
    assert source == "run config"
    assert enabled_exporters(cfg) == ["mlflow"]
    fpath = tmp_path / "c.yaml"
    fpath.write_text("exporters: {local: {enabled: true}}\n")
    cfg, source = build_export_config(fpath, routed, [])
    assert source == str(fpath)
    assert enabled_exporters(cfg) == ["local"]


def _builtin_settings() -> list[tuple[str, Any]]:
    from gym_artifacts.contract.registry import discover

    return [(name, entry.load().config_model) for name, entry in sorted(discover().items())]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_typo_in_a_setting_names_the_setting_meant(data: st.DataObject) -> None:
    """One character dropped, changed or doubled in any setting of any built-in backend
    (``exporters.mlflow.tracking_ur``): the refusal names the key and suggests the setting meant."""
    name, model = data.draw(st.sampled_from(_builtin_settings()))
    key = data.draw(st.sampled_from(sorted(k for k in model.model_fields if len(k) >= 4)))
    i = data.draw(st.integers(0, len(key) - 1))
    edit = data.draw(st.sampled_from(["drop", "change", "double"]))
    typo = {"drop": key[:i] + key[i + 1 :], "change": key[:i] + ("x" if key[i] != "x" else "y") + key[i + 1 :],
            "double": key[:i] + key[i] + key[i:]}[edit]  # fmt: skip
    assume(typo not in model.model_fields)
    with pytest.raises(ConfigError) as caught:
        validate_settings(model, {typo: "x"}, name)
    message = str(caught.value)
    assert message.startswith(f"exporters.{name}.{typo}: unknown setting"), message
    guess = message.split("did you mean ", 1)[1].split("?")[0].strip("'")
    assert guess in model.model_fields, message


def test_the_cli_suggests_the_setting_meant(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from gym_artifacts.cli import main

    run = copy_quickstart(tmp_path / "runs")
    assert main(["export", str(run), "-e", "mlflow", "exporters.mlflow.tracking_ur=http://127.0.0.1:9"]) == 2
    assert "exporters.mlflow.tracking_ur: unknown setting; did you mean 'tracking_uri'?" in capsys.readouterr().err


def test_the_embedded_default_read_once_is_never_changed_by_a_caller() -> None:
    """The default is read once per process; a caller that edits what it got (as a merge with
    overrides may) changes its own copy only: the next caller gets the file's values."""
    from gym_artifacts.core.config import load_default_config

    first = load_default_config()
    original = first.exporters.local.enabled
    first.exporters.local.enabled = not original
    first.exporters["added_by_a_caller"] = {"enabled": True}
    again = load_default_config()
    assert again.exporters.local.enabled == original
    assert "added_by_a_caller" not in again.exporters
