"""Exactly once per destination: receipts know where a run went (real mlflow server, SQLite, local).

A receipt counts only for its exporter *and* destination; a new destination is exported and
gets its own receipt; a re-export to a known destination is SKIPPED without contacting it (a
killed server answers nothing, yet the re-export is quick); ``--verify`` finds deleted runs;
receipts written by version-1 code are still honoured and upgraded on the next write.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from gym_artifacts.cli import main
from gym_artifacts.core.destination import credential_free_uri, destination_key
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.receipts import read_receipts
from tests.conftest import copy_quickstart
from tests.load import scaled
from tests.mlflow_server import MlflowServer
from tests.mlflow_store import mlflow_sqlite

V1_RECEIPTS = Path(__file__).resolve().parent / "fixtures" / "receipts_v1"


def export(run: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    code = main(["export", str(run), "--json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def status(run: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["status", str(run), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def runs_in(uri: str, experiment: str) -> list[str]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else [r.info.run_id for r in client.search_runs([exp.experiment_id])]


@pytest.mark.slow
def test_one_run_to_five_destinations_once_each_then_skipped_without_contact(
    quickstart_run: Path, tmp_path: Path, own_mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server = own_mlflow_server.start()
    sqlite = mlflow_sqlite(tmp_path / 'other.db')
    destinations = [
        ("mlflow", f"exporters.mlflow.tracking_uri={server.uri}", "exporters.mlflow.experiment_name=a"),
        ("mlflow", f"exporters.mlflow.tracking_uri={server.uri}", "exporters.mlflow.experiment_name=b"),
        ("mlflow", f"exporters.mlflow.tracking_uri={sqlite}", "exporters.mlflow.experiment_name=a"),
        ("local", f"exporters.local.root={tmp_path / 'root1'}", "exporters.local.experiment=x"),
        ("local", f"exporters.local.root={tmp_path / 'root2'}", "exporters.local.experiment=x"),
    ]
    for name, *overrides in destinations:
        [result] = export(quickstart_run, capsys, "-e", name, *overrides)
        assert result["status"] == "EXPORTED", result
    assert len(runs_in(server.uri, "a")) == 1
    assert len(runs_in(server.uri, "b")) == 1
    assert len(runs_in(sqlite, "a")) == 1
    assert len(list((tmp_path / "root1" / "x").iterdir())) == 1
    assert len(list((tmp_path / "root2" / "x").iterdir())) == 1
    report = status(quickstart_run, capsys)
    mlflow_where = sorted(r["destination"]["tracking_uri"] + " " + r["destination"]["experiment_name"]
                          for r in report["exporters"]["mlflow"]["receipts"])  # fmt: skip
    assert mlflow_where == sorted([f"{server.uri} a", f"{server.uri} b", f"{credential_free_uri(sqlite)} a"])
    assert sorted(r["destination"]["root"] for r in report["exporters"]["local"]["receipts"]) == [
        str(tmp_path / "root1"), str(tmp_path / "root2"),
    ]  # fmt: skip
    assert all(r["receipt"] == "matches" for e in report["exporters"].values() for r in e["receipts"])

    server.stop()  # nothing may be contacted now: a contact would wait out timeouts and retries
    started = time.monotonic()
    for name, *overrides in destinations:
        [result] = export(quickstart_run, capsys, "-e", name, *overrides)
        assert result["status"] == "SKIPPED", result
    assert time.monotonic() - started < scaled(30)
    assert len(runs_in(sqlite, "a")) == 1


@pytest.mark.slow
def test_a_deleted_backend_run_is_skipped_then_found_by_verify(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = mlflow_sqlite(tmp_path / 'm.db')
    overrides = [f"exporters.mlflow.tracking_uri={uri}", f"exporters.local.root={tmp_path / 'store'}"]
    first = {r["exporter"]: r for r in export(quickstart_run, capsys, *overrides)}
    assert {r["status"] for r in first.values()} == {"EXPORTED"}
    MlflowClient(uri).delete_run(first["mlflow"]["backend_run_id"])
    shutil.rmtree(tmp_path / "store" / "default" / first["local"]["backend_run_id"])

    again = {r["exporter"]: r for r in export(quickstart_run, capsys, *overrides)}
    assert {r["status"] for r in again.values()} == {"SKIPPED"}  # no --verify: nothing asked
    report = status(quickstart_run, capsys, "--verify")
    for name in ("mlflow", "local"):
        [receipt] = report["exporters"][name]["receipts"]
        assert receipt["verified"] == "missing", receipt

    verified = {r["exporter"]: r for r in export(quickstart_run, capsys, "--verify", *overrides)}
    assert {r["status"] for r in verified.values()} == {"EXPORTED"}, verified
    new_run = verified["mlflow"]["backend_run_id"]
    assert new_run != first["mlflow"]["backend_run_id"] and runs_in(uri, "gym-evals") == [new_run]
    assert (tmp_path / "store" / "default" / verified["local"]["backend_run_id"] / "run.json").is_file()
    present = status(quickstart_run, capsys, "--verify")
    assert [r["verified"] for e in ("mlflow", "local") for r in present["exporters"][e]["receipts"]] == [
        "present", "present",
    ]  # fmt: skip
    checked = {r["exporter"]: r for r in export(quickstart_run, capsys, "--verify", *overrides)}
    assert {r["status"] for r in checked.values()} == {"SKIPPED"}
    assert checked["mlflow"]["reason"] == "verified: the backend run exists"


@pytest.mark.slow
def test_version_1_receipts_are_honoured_for_the_run_config_destination_and_upgraded(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gym_artifacts.run.identity import content_identities, run_identity

    run = RunArtifacts.from_path(quickstart_run)
    identities = content_identities(run)
    for name in ("local", "mlflow"):
        # The version-1 file as 0.1.0 wrote it; its identities are those of the quickstart of
        # that day, so they are set to today's quickstart's (every other field kept as written).
        receipt = json.loads((V1_RECEIPTS / f"eval_{name}_export_done.json").read_text())
        receipt.update(identities=identities, run_identity=run_identity(identities))
        run.export_done_fpath(name).write_text(json.dumps(receipt, indent=2))
    # The run's config configures no exporter: the embedded default is where version 1 sent it.
    results = export(quickstart_run, capsys)
    assert [(r["exporter"], r["status"]) for r in results] == [("local", "SKIPPED"), ("mlflow", "SKIPPED")]
    assert not Path("mlflow.db").exists() and not Path("gym-artifacts-runs").exists()  # nothing contacted
    v1_text = run.export_done_fpath("local").read_text()
    assert json.loads(v1_text)["version"] == 1  # a skip writes nothing

    [other] = export(quickstart_run, capsys, "-e", "local", f"exporters.local.root={tmp_path / 'elsewhere'}")
    assert other["status"] == "EXPORTED"
    document = json.loads(run.export_done_fpath("local").read_text())
    assert document["version"] == 2
    receipts = read_receipts(run.export_done_fpath("local"))
    default_root = str(Path("gym-artifacts-runs").resolve())
    assert sorted(r.destination["root"] for r in receipts) == sorted([default_root, str(tmp_path / "elsewhere")])
    old = next(r for r in receipts if r.destination["root"] == default_root)
    assert old.backend_run_id == json.loads(v1_text)["backend_run_id"]
    assert old.destination_key == destination_key(old.destination)
    [again] = export(quickstart_run, capsys, "-e", "local")  # the upgraded receipt still speaks
    assert again["status"] == "SKIPPED"


def test_destinations_hold_no_credentials() -> None:
    assert credential_free_uri("https://alice:s3cret@mlflow.example:8443/?token=abc&x=1") == (
        "https://mlflow.example:8443?x=1"
    )
    assert credential_free_uri("postgresql://u:pw@db/ml") == "postgresql://db/ml"
    assert credential_free_uri("sqlite:///rel.db") == f"sqlite:///{Path('rel.db').resolve()}"
    assert credential_free_uri("http://h:5000/") == credential_free_uri("http://h:5000")


def test_a_third_party_backend_gets_the_default_destination(quickstart_run: Path) -> None:
    from omegaconf import OmegaConf

    from gym_artifacts.contract import registry
    from gym_artifacts.export.engine import build_target
    from tests.backends import CountingExporter

    registry.register(CountingExporter)
    try:
        cfg = OmegaConf.create({"exporters": {"counting": {"enabled": True}}})
        target = build_target("counting", cfg, None)
    finally:
        registry.unregister("counting")
    assert target.destination == {} and target.key == destination_key({})


def test_the_default_destination_resolves_path_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's ``folder: Path`` setting: one place however it is spelled, two places for one
    relative spelling in two working folders."""
    from gym_artifacts.core.config import ExporterConfig
    from gym_artifacts.core.destination import default_destination

    class FolderSettings(ExporterConfig):
        folder: Path = Path("./ledgers")

    def where(folder: str) -> dict[str, Any]:
        return default_destination(FolderSettings(folder=Path(folder)))

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    in_a = where("ledgers")
    assert in_a == where("./ledgers/") == where(str(tmp_path / "a" / "ledgers")) == where("../a/ledgers")
    monkeypatch.chdir(tmp_path / "b")
    assert where("ledgers") != in_a


@pytest.mark.parametrize(
    ("exporter", "url", "expected_url", "secrets"),
    [
        (
            "langsmith",
            "https://alice:pw-canary-91@eu.api.smith.langchain.com:8443/api/?api_key=qk-canary-17&region=eu",
            "https://eu.api.smith.langchain.com:8443/api?region=eu",
            ("alice", "pw-canary-91", "qk-canary-17"),
        ),
        (
            "phoenix",
            "http://bob:pw-canary-33@phoenix.internal:6006/?token=qt-canary-58&space=a",
            "http://phoenix.internal:6006?space=a",
            ("bob", "pw-canary-33", "qt-canary-58"),
        ),
    ],
)
def test_dataset_service_destination_is_url_and_names_without_credentials(
    exporter: str, url: str, expected_url: str, secrets: tuple[str, ...]
) -> None:
    """LangSmith and Phoenix: a key in the URL, in its query or in ``api_key``: none reaches the
    receipt's destination, while the names that select where runs go do; a timeout is not a
    destination."""
    from gym_artifacts.contract.registry import get_entry

    cls = get_entry(exporter).load()
    url_field = "api_url" if exporter == "langsmith" else "base_url"
    api_key = f"sk-{exporter}-canary-2b7e40"
    section = {url_field: url, "api_key": api_key, "dataset_name": "d", "experiment_name": "e"}

    def destination(**extra: Any) -> dict[str, Any]:
        cfg = OmegaConf.create({"exporters": {exporter: {**section, **extra}}})
        return cls.destination_for(cls.settings_from(cfg))

    where = destination()
    assert where == {url_field: expected_url, "dataset_name": "d", "experiment_name": "e"}
    for secret in (*secrets, api_key):
        assert secret not in json.dumps(where)
    assert destination(request_timeout=5) == where
    assert destination(dataset_name="other") != where
    assert destination(experiment_name="other") != where


def test_one_folder_reached_through_a_link_or_home_is_one_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder named through a symbolic link, ``~`` or ``..`` is where the files land: one
    destination for the local root, TensorBoard's log folder and W&B's offline folder; the W&B
    server comes from ``WANDB_BASE_URL`` when the settings name none, as the SDK takes it."""
    from gym_artifacts.contract.registry import get_entry

    real = tmp_path / "roots" / "A"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("HOME", str(tmp_path / "roots"))
    monkeypatch.chdir(tmp_path)
    spellings = [str(real), "link", "link/", "~/A", "roots/../link"]
    for name, key in [("local", "root"), ("tensorboard", "logdir"), ("wandb", "dir")]:
        cls = get_entry(name).load()
        where = [
            cls.destination_for(cls.settings_from(OmegaConf.create({"exporters": {name: {key: s}}})))
            for s in spellings
        ]
        assert all(w == where[0] for w in where), (name, where)
    wandb = get_entry("wandb").load()
    online = OmegaConf.create({"exporters": {"wandb": {"mode": "online"}}})
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.internal.example:8443/")
    assert wandb.destination_for(wandb.settings_from(online))["base_url"] == "https://wandb.internal.example:8443"
    monkeypatch.delenv("WANDB_BASE_URL")
    assert wandb.destination_for(wandb.settings_from(online))["base_url"] == "https://api.wandb.ai"


@pytest.mark.parametrize(
    "unresolvable",
    ["${oc.env:GYM_ARTIFACTS_TEST_GONE_FOREVER}", "${no.such.key}", "${oc.env:GYM_ARTIFACTS_TEST_GONE_FOREVER}/sub"],
)
@pytest.mark.parametrize("setting", ["root", "experiment"])
def test_a_destination_that_cannot_be_resolved_is_failed_even_beside_a_receipt(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, unresolvable: str
) -> None:
    """The run already went to one store: an export whose destination cannot be resolved (an
    environment variable gone, an interpolation to nothing) is FAILED, exit 1, naming the
    section, as for a fresh run; never SKIPPED on the strength of another store's receipt."""
    good = tmp_path / "good.yaml"
    good.write_text(f"exporters:\n  local:\n    enabled: true\n    root: {tmp_path / 'store'}\n    experiment: e\n")
    assert export(quickstart_run, capsys, "-c", str(good))[0]["status"] == "EXPORTED"
    values = {"root": str(tmp_path / "store"), "experiment": "e"} | {setting: unresolvable}
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "exporters:\n  local:\n    enabled: true\n"
        + "".join(f"    {k}: '{v}'\n" for k, v in values.items())
    )
    for run in (quickstart_run, copy_quickstart(tmp_path / "fresh")):
        code = main(["export", str(run), "--json", "-c", str(bad)])
        [result] = json.loads(capsys.readouterr().out)
        assert (code, result["status"]) == (1, "FAILED"), result
        assert result["reason"].startswith("exporters.local: cannot resolve: "), result
