"""Runtime artifact names with ``%``, spaces, unicode, ``#`` and control characters, exported to
a real ``mlflow server`` that proxies artifacts: every name is stored exactly and read back byte
for byte, or (one MLflow cannot store exactly) refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.load import scaled
from tests.mlflow_server import MlflowServer

pytest.importorskip("mlflow")

NAMES = ["100%.txt", "50% off.txt", "with space.txt", "ünïcödé ☃.txt", "a+b&c=d.txt", "semi;colon'quote.txt"]
# A server refuses "#" and decodes %-escapes (100%25.txt would become 100%.txt); MLflow's client
# cannot download a name holding "?"; a URL path cannot carry a control character.
REFUSED = ["sample#1.txt", "a%23b.txt", "what?.txt", "100%25.txt", "new\nline.txt", "tab\tname.txt"]


def mlflow_cfg(uri: str, experiment: str) -> object:
    section = {"enabled": True, "tracking_uri": uri, "experiment_name": experiment}
    return OmegaConf.create({"exporters": {"mlflow": section}})


def test_odd_names_stored_exactly_through_proxied_artifacts(
    quickstart_run: Path, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    artifacts = quickstart_run.with_name("eval_artifacts")
    for i, name in enumerate(NAMES):
        (artifacts / name).write_text(f"content {i} of {name}")
    [result] = export_run(quickstart_run, mlflow_cfg(mlflow_server.uri, "names"))
    assert result.status is ExportStatus.EXPORTED, result.reason
    client = MlflowClient(mlflow_server.uri)
    stored = {Path(f.path).name for f in client.list_artifacts(result.backend_run_id, "runtime")}
    assert set(NAMES) <= stored, sorted(stored)
    for i, name in enumerate(NAMES):
        dest = str(tmp_path / f"d{i}")
        local = Path(client.download_artifacts(result.backend_run_id, f"runtime/{name}", dest))
        assert local.name == name and local.read_text() == f"content {i} of {name}"
    on_server = {p.name for p in mlflow_server.artifacts.rglob("*") if p.is_file()}
    assert set(NAMES) <= on_server


@pytest.mark.parametrize("name", REFUSED)
def test_names_mlflow_cannot_store_refused_before_anything_is_sent(
    quickstart_run: Path, mlflow_server: MlflowServer, name: str
) -> None:
    from mlflow.tracking import MlflowClient

    experiment = f"refused-{REFUSED.index(name)}"
    (quickstart_run.with_name("eval_artifacts") / name).write_text("x")
    [result] = export_run(quickstart_run, mlflow_cfg(mlflow_server.uri, experiment))
    assert result.status is ExportStatus.FAILED
    assert repr(name) in result.reason and "\n" not in result.reason, result.reason
    assert result.seconds < scaled(30)
    assert MlflowClient(mlflow_server.uri).get_experiment_by_name(experiment) is None  # nothing sent
