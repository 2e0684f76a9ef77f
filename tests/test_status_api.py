"""run_status: the API behind ``gym-artifacts status`` (the CLI only prints what it returns)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym_artifacts import export_run
from gym_artifacts.cli import main
from gym_artifacts.core.errors import MissingRunError
from gym_artifacts.export.status import run_status


def test_status_before_and_after_an_export(quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omegaconf import OmegaConf

    before = run_status(quickstart_run)
    assert before.missing_for_export is None and before.exporters["local"]["receipt"] == "none"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}})
    [result] = export_run(quickstart_run, cfg)
    after = run_status(quickstart_run)
    assert after.run_identity == before.run_identity
    assert after.exporters["local"]["receipt"] == "matches"
    assert after.exporters["local"]["backend_run_id"] == result.backend_run_id
    assert main(["status", str(quickstart_run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == after.to_json()  # the CLI prints the API's answer


def test_missing_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MissingRunError):
        run_status(tmp_path / "nothing.jsonl")


@pytest.mark.parametrize(
    "run_exporters",
    [None, {"local": {"enabled": True}}, {"phoenix": {"enabled": False}, "local": {"enabled": True}}],
)
def test_status_and_the_report_list_the_configured_exporters_and_those_with_receipts(
    quickstart_run: Path, tmp_path: Path, run_exporters: dict | None
) -> None:
    """Status and the report list what the run's export would use (the run's saved exporters,
    else the embedded default's) and any backend with a receipt or live-run marker beside the
    run; never a registered backend that nothing configures (langsmith, phoenix, plugins)."""
    import yaml

    from gym_artifacts.core.config import load_default_config
    from gym_artifacts.report import build_report

    config = quickstart_run.with_name("eval_config.yaml")
    if run_exporters is not None:
        data = yaml.safe_load(config.read_text()) or {}
        data["exporters"] = run_exporters
        config.write_text(yaml.safe_dump(data))
    configured = set(run_exporters or load_default_config()["exporters"])
    assert set(run_status(quickstart_run).exporters) == configured
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}}})
    [result] = export_run(quickstart_run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    listed = set(run_status(quickstart_run).exporters)
    assert listed == configured | {"tensorboard"}
    page = build_report(quickstart_run, tmp_path / "report.html").read_text()
    for name in {"langsmith", "phoenix", "ledger", "wandb", "mlflow"} - listed:
        assert f"<td>{name}</td>" not in page, name
    for name in listed:
        assert f"<td>{name}</td>" in page, name
