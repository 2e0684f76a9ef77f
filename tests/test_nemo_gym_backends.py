"""Coverage of real NeMo Gym 0.7 runs (``tests/fixtures/nemo-gym-0.7.0``) in every backend.

``clean`` scored 10 of 10 planned rollouts; ``with-failures`` 8 of 10 with 2 in the failures
sidecar. W&B is read back from its offline files, TensorBoard with its own event reader, LangSmith
through its client from a local endpoint; Phoenix's experiment metadata is checked at the call
that sends it (its server test runs the quickstart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.test_nemo_gym import COVERAGE, copy_fixture

FIXTURES = ["clean", "with-failures"]
COVERAGE_TEXT = {
    "clean": "10 of 10 planned rollouts scored",
    "with-failures": "8 of 10 planned rollouts scored (2 failed) - partial",
}


def expected_coverage(name: str) -> dict[str, float]:
    """The ``coverage/*`` values NeMo Gym's names give this fixture."""
    expected, scored, missing, failed = COVERAGE[name]
    return {
        "coverage/expected": expected,
        "coverage/scored": scored,
        "coverage/missing": missing,
        "coverage/failed": failed,
    }


def assert_coverage_text(name: str, text: str) -> None:
    assert text == COVERAGE_TEXT[name]


def exported(name: str, tmp_path: Path, section: str, settings: dict[str, Any]) -> str:
    run = copy_fixture(name, tmp_path)
    [result] = export_run(run, OmegaConf.create({"exporters": {section: {"enabled": True, **settings}}}))
    assert result.status is ExportStatus.EXPORTED, result.reason
    return str(result.backend_run_id)


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_wandb_summary_has_coverage(name: str, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from tests.wandb_records import offline_runs

    settings = {"project": "ng", "mode": "offline", "dir": str(tmp_path / "wb")}
    run_id = exported(name, tmp_path, "wandb", settings)
    [run] = offline_runs(tmp_path / "wb")
    assert run.run_id == run_id
    got = {k: v for k, v in run.summary.items() if k.startswith("coverage/")}
    assert_coverage_text(name, got.pop("coverage/text"))
    assert got == expected_coverage(name)


@pytest.mark.parametrize("name", FIXTURES)
def test_tensorboard_scalars_have_coverage(name: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tests.test_tensorboard import read_run, texts

    run_id = exported(name, tmp_path, "tensorboard", {"logdir": str(tmp_path / "tb")})
    acc = read_run(tmp_path / "tb" / run_id)
    scalars = {
        t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"] if t.startswith("coverage/")
    }
    assert scalars == {k: [v] for k, v in expected_coverage(name).items()}
    [(_, text)] = texts(acc, "coverage/text")
    assert_coverage_text(name, text)


@pytest.mark.parametrize("name", FIXTURES)
def test_langsmith_project_metadata_has_coverage(name: str, tmp_path: Path) -> None:
    pytest.importorskip("langsmith")
    from langsmith import Client

    from tests.langsmith_api import LangsmithApi

    api = LangsmithApi().start()
    try:
        project_id = exported(name, tmp_path, "langsmith", {"api_url": api.url, "api_key": "lsv2_pt_k"})
        client = Client(api_url=api.url, api_key="lsv2_pt_k", auto_batch_tracing=False)
        metadata = client.read_project(project_id=project_id).metadata
    finally:
        api.stop()
    assert metadata["coverage"] == expected_coverage(name)


@pytest.mark.parametrize("name", FIXTURES)
def test_phoenix_experiment_metadata_has_coverage(name: str, tmp_path: Path) -> None:
    """What the Phoenix client is asked to create: the experiment's metadata carry ``coverage/*``."""
    from gym_artifacts._builtin_exporters.phoenix import PhoenixExporter
    from gym_artifacts.contract.hooks import ExportPlan
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.coverage import coverage_of

    run = RunArtifacts.from_path(copy_fixture(name, tmp_path))
    plan = ExportPlan(
        identities={}, run_identity="sha256:ng", upload_rollouts=True, coverage=coverage_of(run)
    )
    created: list[dict[str, Any]] = []

    class Experiments:
        def list(self, **_: Any) -> list[dict[str, Any]]:
            return []

        def create(self, **kw: Any) -> dict[str, Any]:
            created.append(kw)
            return {"id": "exp-1"}

    class RecordingClient:
        experiments = Experiments()

    exporter = PhoenixExporter(PhoenixExporter.config_model(enabled=True))
    from gym_artifacts.contract.run_payload import RunPayload

    payload = RunPayload.of(run, plan)
    assert exporter._experiment(RecordingClient(), run, plan, payload, "ds-1", 1) == "exp-1"
    [sent] = created
    assert sent["experiment_metadata"]["coverage"] == expected_coverage(name)
