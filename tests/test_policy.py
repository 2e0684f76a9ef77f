"""One precedence policy: every setting and flag gives the same export through the CLI and through
the Python API (``export_runs``, and ``build_export_config`` + ``export_run``), a refused request is
refused alike by both, and a flat key on the command line wins over the embedded default's sections.

Each case runs once per side, in its own working folder (the embedded default's paths are
relative), and compares statuses, rows, the destination every receipt names, and what the
backends hold (MLflow run names and experiments, local rows).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run, export_runs
from gym_artifacts.cli import main
from gym_artifacts.core.config import build_export_config
from gym_artifacts.core.errors import GymArtifactsError
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts, write_marker
from gym_artifacts.run.run_config import load_run_config
from tests.conftest import copy_quickstart

LOCAL_ONLY = ["-e", "local"]
CASES: dict[str, dict[str, Any]] = {
    "mlflow_tracking_uri": {"overrides": ["mlflow_tracking_uri=sqlite:///flat.db"], "exporters": ["mlflow"]},
    "mlflow_experiment_name": {"overrides": ["mlflow_experiment_name=flat-exp"], "exporters": ["mlflow"]},
    "mlflow_run_name": {"overrides": ["mlflow_run_name=flat-run"], "exporters": ["mlflow"]},
    "mlflow_tracking_token": {"overrides": ["mlflow_tracking_token=tok-canary"], "exporters": ["mlflow"]},
    "wandb_project": {"overrides": ["wandb_project=flat-proj"], "exporters": ["wandb"]},
    "wandb_name": {"overrides": ["wandb_project=flat-proj", "wandb_name=flat-name"], "exporters": ["wandb"]},
    "wandb_api_key": {
        "overrides": ["wandb_project=flat-proj", "wandb_api_key=key-canary"],
        "exporters": ["wandb"],
    },
    "upload_rollouts=false": {"overrides": ["upload_rollouts=false"], "exporters": ["local"]},
    "upload_rollouts_to_wandb=false": {
        "overrides": ["upload_rollouts_to_wandb=false"],
        "exporters": ["local"],
    },
    "--no-upload-rollouts": {"upload": False, "exporters": ["local"]},
    "--upload-rollouts beats key=value": {
        "overrides": ["upload_rollouts=false"],
        "upload": True,
        "exporters": ["local"],
    },
    "-e local": {"exporters": ["local"]},
    "no -e: every enabled": {"overrides": ["exporters.mlflow.enabled=false"]},
    "key=value section": {
        "overrides": ["exporters.local.root=./elsewhere", "exporters.local.experiment=x"],
        "exporters": ["local"],
    },
    "-c": {
        "config": "exporters:\n  local: {enabled: true, root: ./from-c, experiment: c}\n"
        "upload_rollouts: false\n"
    },
    "-c then key=value": {
        "config": "exporters:\n  local: {enabled: true, root: ./from-c}\nupload_rollouts: false\n",
        "overrides": ["upload_rollouts=true"],
    },
    "-c, the run's saved upload_rollouts": {
        "config": "exporters:\n  local: {enabled: true, root: ./from-c}\n",
        "saved": "upload_rollouts: false\n",
    },
    "--complete-live-run": {"certify": True, "exporters": ["local"], "live_marker": True},
    "--no-complete-live-run": {"certify": False, "exporters": ["local"], "live_marker": True},
    "default certify": {"exporters": ["local"], "live_marker": True},
}


@pytest.fixture(scope="module")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialized, empty SQLite store: copied per side instead of migrating a fresh one."""
    db = tmp_path_factory.mktemp("db") / "empty.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


def prepare(side: Path, spec: dict[str, Any], empty_db: Path) -> Path:
    side.mkdir()
    for name in ("mlflow.db", "flat.db"):
        shutil.copy(empty_db, side / name)
    run = copy_quickstart(side / "runs")
    if spec.get("live_marker"):  # a live local run that completed losslessly with these identities
        from gym_artifacts.run.identity import content_identities
        from gym_artifacts.run.receipts import RunIdMarker

        live = side / "gym-artifacts-runs" / "default" / "eval-live-1"
        live.mkdir(parents=True)
        (live / "run.json").write_text(json.dumps({"run_id": "eval-live-1", "status": "FINISHED"}))
        ids = content_identities(RunArtifacts.from_path(run))
        write_marker(RunArtifacts.from_path(run).run_id_marker_fpath("local"), RunIdMarker(
            exporter="local", run_id="eval-live-1", state="completed", identities=ids, lossless=True))
    if "config" in spec:
        (side / "export.yaml").write_text(spec["config"])
    if "saved" in spec:  # a setting the eval saved with the run
        with open(run.with_name("eval_config.yaml"), "a") as fh:
            fh.write(spec["saved"])
    return run


def via_cli(run: Path, spec: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    argv = ["export", str(run), "--json", *spec.get("overrides", [])]
    argv += [a for e in spec.get("exporters", []) for a in ("-e", e)]
    if spec.get("upload") is not None:
        argv.append("--upload-rollouts" if spec["upload"] else "--no-upload-rollouts")
    if spec.get("certify") is not None:
        argv.append("--complete-live-run" if spec["certify"] else "--no-complete-live-run")
    if "config" in spec:
        argv += ["-c", "export.yaml"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def via_api(run: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    artifacts = RunArtifacts.from_path(run)
    cfg, _ = build_export_config(
        "export.yaml" if "config" in spec else None, load_run_config(artifacts), spec.get("overrides", [])
    )
    results = export_run(
        artifacts, cfg, exporters=spec.get("exporters") or None,
        upload_rollouts=spec.get("upload"), certify=spec.get("certify"),
    )
    return [r.to_json(str(run)) for r in results]


def via_export_runs(run: Path, spec: dict[str, Any], *, mapping: bool = False) -> list[dict[str, Any]]:
    """``export_runs`` given ``-c``'s file, or (``mapping``) its content as a mapping."""
    config: Any = None
    if "config" in spec:
        config = yaml.safe_load(spec["config"]) if mapping else "export.yaml"
    [out] = export_runs(
        [run], config, overrides=spec.get("overrides", []),
        exporters=spec.get("exporters", []), upload_rollouts=spec.get("upload"), certify=spec.get("certify"),
    )  # fmt: skip
    assert out.config_error is None, out.config_error
    return out.to_json()


def landed(side: Path, run: Path, results: list[dict[str, Any]]) -> list[Any]:
    """Side-independent facts: status, rows, reason, receipt destination, backend contents."""
    facts: list[Any] = []
    artifacts = RunArtifacts.from_path(run)
    for r in results:
        receipts = read_receipts(artifacts.export_done_fpath(r["exporter"]))
        where = [json.dumps(x.destination, sort_keys=True).replace(str(side), "<side>") for x in receipts]
        facts.append((r["exporter"], r["status"], r["rows"], r["reason"], where))
        if r["exporter"] == "mlflow":
            [dest] = [x.destination for x in receipts]
            client = MlflowClient(dest["tracking_uri"])
            run_info = client.get_run(r["backend_run_id"])
            experiment = client.get_experiment(run_info.info.experiment_id).name
            facts.append(
                (run_info.info.run_name, experiment, run_info.data.params.get("mlflow_tracking_token"))
            )
        if r["exporter"] == "local":
            [dest] = [x.destination for x in receipts]
            run_json = json.loads(
                (Path(dest["root"]) / dest["experiment"] / r["backend_run_id"] / "run.json").read_text()
            )
            facts.append((run_json["rows"], run_json.get("certified", False), r["backend_run_id"]))
    return facts


@pytest.mark.parametrize("case", list(CASES))
def test_cli_and_api_give_the_same_export(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    empty_mlflow_db: Path,
) -> None:
    spec = CASES[case]
    outcomes = []
    sides: list[tuple[str, Any]] = [
        ("cli", lambda run: via_cli(run, spec, capsys)),
        ("api", lambda run: via_api(run, spec)),
        ("export_runs", lambda run: via_export_runs(run, spec)),
    ]
    if "config" in spec:  # -c's content given to export_runs as a mapping
        sides.append(("export_runs with a mapping", lambda run: via_export_runs(run, spec, mapping=True)))
    for side_name, export in sides:
        side = tmp_path / side_name
        run = prepare(side, spec, empty_mlflow_db)
        monkeypatch.chdir(side)
        for var in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR"):  # each side its own W&B folders:
            (side / var.lower()).mkdir()  # in one, the second side would find the first's run
            monkeypatch.setenv(var, str(side / var.lower()))
        results = export(run)
        assert all(r["status"] == "EXPORTED" for r in results), results
        outcomes.append(landed(side, run, results))
    assert outcomes[1:] == [outcomes[0]] * (len(sides) - 1), outcomes


def test_flat_keys_on_the_command_line_win_over_the_embedded_default(
    quickstart_run: Path, capsys: pytest.CaptureFixture[str], empty_mlflow_db: Path
) -> None:
    shutil.copy(empty_mlflow_db, "other.db")
    argv = ["export", str(quickstart_run), "--json", "-e", "mlflow", "mlflow_tracking_uri=sqlite:///other.db",
            "mlflow_experiment_name=flat"]
    assert main(argv) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["status"] == "EXPORTED"
    client = MlflowClient("sqlite:///other.db")
    assert client.get_experiment(client.get_run(result["backend_run_id"]).info.experiment_id).name == "flat"
    assert not Path("mlflow.db").exists()  # the embedded default's store was never used


def test_upload_rollouts_false_sends_no_rows_through_the_api(quickstart_run: Path, tmp_path: Path) -> None:
    artifacts = RunArtifacts.from_path(quickstart_run)
    cfg, _ = build_export_config(None, load_run_config(artifacts), ["upload_rollouts=false",
                                                                     f"exporters.local.root={tmp_path / 's'}"])
    [result] = export_run(artifacts, cfg, exporters=["local"])
    assert result.status.value == "EXPORTED" and result.rows == 0


# Requests no run can be exported with: (CLI arguments, export_runs keyword arguments).
REFUSED: dict[str, tuple[list[str], dict[str, Any]]] = {
    "unknown exporter": (["-e", "nope"], {"exporters": ["nope"]}),
    "unknown config key": (["-c", "export.yaml"], {"config": "export.yaml"}),
    "malformed override": (["exporters.local.enabled=perhaps", "-e", "local"],
                           {"overrides": ["exporters.local.enabled=perhaps"], "exporters": ["local"]}),
    "typo'd override key": (["upload_rollout=false", "-e", "local"],
                            {"overrides": ["upload_rollout=false"], "exporters": ["local"]}),
    "non-bool upload override": (["upload_rollouts=maybe", "-e", "local"],
                                 {"overrides": ["upload_rollouts=maybe"], "exporters": ["local"]}),
    "jobs 0": (["--jobs", "0"], {"jobs": 0}),
    "ray address without ray": (["--ray-address", "auto"], {"ray_address": "auto"}),
    "ray connect timeout without ray": (["--ray-connect-timeout", "5"], {"ray_connect_timeout": 5}),
    "ray connect timeout 0": (["--executor", "ray", "--ray-connect-timeout", "0"],
                              {"executor": "ray", "ray_connect_timeout": 0}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_cli_and_api_refuse_the_same_request_alike(
    case: str, quickstart_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI exits 2 with the API's own message, and neither sends anything anywhere."""
    Path("export.yaml").write_text("exporters:\n  local: {enabled: true}\nuplod_rollouts: false\n")
    argv, kwargs = REFUSED[case]
    assert main(["export", str(quickstart_run), *argv]) == 2
    err = capsys.readouterr().err
    try:
        [out] = export_runs([quickstart_run], **kwargs)
        message = out.config_error
    except GymArtifactsError as exc:
        message = str(exc)
    assert message and message in err, (message, err)
    assert not list(quickstart_run.parent.glob("*_export_done*")) and not Path("gym-artifacts-runs").exists()
