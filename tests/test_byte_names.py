"""Run folders and files whose names are not UTF-8 (``r\\xe9sultats`` as bytes, what a Latin-1
system writes): every command works on them, and every file written about them is valid UTF-8."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.cli import main
from gym_artifacts.core.jsonio import escaped_text
from gym_artifacts.export.status import run_status
from tests.conftest import copy_quickstart
from tests.mlflow_store import mlflow_sqlite

# Any bytes a POSIX file name may hold: no "/", no NUL, not "." or "..".
NAME_BYTES = st.binary(min_size=1, max_size=16).filter(lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b".."))


def _bytes_run(tmp_path: Path, folder: bytes, stem: bytes | None) -> Path:
    root = os.path.join(os.fsencode(tmp_path), uuid.uuid4().hex.encode(), folder)
    return copy_quickstart(Path(os.fsdecode(root)), os.fsdecode(stem) if stem else "eval")


def _valid_utf8_files(dpath: Path) -> None:
    """Every file the commands wrote under ``dpath`` (not the run's own files) is UTF-8 text or
    binary data, and every JSON file parses."""
    for fpath in dpath.rglob("*"):
        if fpath.is_file() and fpath.suffix in (".json", ".html", ".jsonl", ".yaml", ".txt", ".error"):
            text = fpath.read_bytes().decode("utf-8")  # strict: a surrogate written raw would fail here
            if fpath.suffix == ".json":
                json.loads(text)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(folder=NAME_BYTES, stem=st.one_of(st.none(), NAME_BYTES.filter(lambda b: not b.startswith(b"."))))
def test_every_command_works_on_a_run_whose_names_are_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], folder: bytes, stem: bytes | None
) -> None:
    run = _bytes_run(tmp_path, folder, stem)
    store = Path(os.fsdecode(os.path.join(os.fsencode(run.parent.parent), b"store")))
    state = run_status(run)
    assert state.missing_for_export is None
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store), "experiment": "t"}}})
    [result] = export_run(run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    [again] = export_run(run, cfg)
    assert again.status.value == "SKIPPED", again.reason
    report = run.parent / "out_report.html"
    code = main(["report", str(run), "-o", str(report)])
    assert code == 0, capsys.readouterr().err
    page = run.parent / "compare.html"
    code = main(["compare", str(run), str(run), "-o", str(page)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["status", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exporters"]["local"]["receipt"] == "matches"
    _valid_utf8_files(store)
    for fpath in (report, page, *run.parent.glob("*.done.json")):
        fpath.read_bytes().decode("utf-8")


@pytest.mark.slow
def test_mlflow_exports_a_run_whose_folder_name_is_not_utf8(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = _bytes_run(tmp_path, b"r\xe9sultats", None)
    uri = mlflow_sqlite(tmp_path / 'm.db')
    cfg = OmegaConf.create({"exporters": {"mlflow": {
        "enabled": True, "tracking_uri": uri, "experiment_name": "bytes", "export_deadline": 120}}})  # fmt: skip
    [result] = export_run(run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    name = MlflowClient(uri).get_run(result.backend_run_id).info.run_name
    name.encode("utf-8")
    assert "sultats" in name


def _wandb_display_names(run_folder: Path) -> set[str]:
    """The run names W&B recorded in an offline run's ``.wandb`` file (its own inspector)."""
    from tests.wandb_records import inspected_records

    [wandb_file] = run_folder.glob("run-*.wandb")
    return {r["run"]["display_name"] for r in inspected_records(wandb_file) if r.get("type") == "run"}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["dir", "WANDB_DIR", "cwd"])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(folder=NAME_BYTES.filter(lambda b: not b.startswith(b".")))
def test_wandb_offline_exports_a_run_whose_folder_name_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bytes, where: str
) -> None:
    """W&B offline beside a run whose folder is not UTF-8 (its ``dir`` set there, ``WANDB_DIR``, or
    no folder at all: the working folder, the run's own): one run, whole, in that folder, read back
    from W&B's own files; named with the folder's bytes as escapes; again SKIPPED."""
    pytest.importorskip("wandb")
    from tests.wandb_records import offline_runs

    run = _bytes_run(tmp_path, folder + b"-\xe9", None)  # one byte that is never UTF-8 on its own
    wb = run.parent / "wb"
    wb.mkdir()
    section: dict[str, object] = {"enabled": True, "project": "bytes", "mode": "offline"}
    if where == "dir":
        section["dir"] = str(wb)
    elif where == "WANDB_DIR":
        monkeypatch.setenv("WANDB_DIR", str(wb))
    else:
        monkeypatch.delenv("WANDB_DIR", raising=False)
        monkeypatch.chdir(wb)
    temp = tmp_path / uuid.uuid4().hex
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where a link W&B is given would be
    cfg = OmegaConf.create({"exporters": {"wandb": section}})
    [result] = export_run(run, cfg)
    assert result.status.value == "EXPORTED", result.reason
    assert not list(temp.glob("gym-artifacts-wandb-dir-*"))  # no link outlives the W&B run
    [written] = offline_runs(wb)
    assert written.run_id == result.backend_run_id
    assert written.exit_code == 0
    assert len(written.history) == 20  # every journal step of the quickstart
    assert _wandb_display_names(written.folder) == {escaped_text(f"{run.parent.name}/eval")}
    [again] = export_run(run, cfg)
    assert again.status.value == "SKIPPED", again.reason
    assert len(offline_runs(wb)) == 1


@settings(max_examples=200, deadline=None)
@given(first=NAME_BYTES, second=NAME_BYTES)
def test_folders_of_any_bytes_are_one_destination_each(first: bytes, second: bytes) -> None:
    """A destination's key is computed for a folder of any bytes, and two folders share a key only
    when they are one folder: ``r\\xe9sultats`` is neither ``r\\\\udce9sultats`` (the escape spelled
    out) nor ``r\\xc3\\xa9sultats`` (its UTF-8 spelling)."""
    from gym_artifacts.core.destination import destination_key

    def key(name: bytes) -> str:
        return destination_key({"dir": os.fsdecode(b"/runs/" + name)})

    assert (key(first) == key(second)) == (first == second)
    escaped = escaped_text(os.fsdecode(first))
    assert escaped == os.fsdecode(first) or key(first) != destination_key({"dir": "/runs/" + escaped})


def test_wandb_live_logging_into_a_folder_whose_name_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live logging offline into a run folder that is not UTF-8 (W&B's folder there): every step
    logged, read back from W&B's files; no link outlives the run."""
    pytest.importorskip("wandb")
    from gym_artifacts.live import live_run
    from tests.wandb_records import offline_runs

    folder = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"r\xe9sultats")))
    folder.mkdir()
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    # W&B's folder from WANDB_DIR: a config value that is not UTF-8 cannot be saved beside the run
    # yet (OUT_config.yaml is UTF-8 text; left for later, see the report of issue 42)
    monkeypatch.setenv("WANDB_DIR", str(folder / "wb"))
    (folder / "wb").mkdir()
    cfg = {"exporters": {"wandb": {"enabled": True, "project": "bytes", "mode": "offline"}}}
    with live_run(cfg, folder / "eval.jsonl") as live:
        for step in range(3):
            live.export_metrics({"loss": 1 / (step + 1)}, step=step)
        live.flush(60)
    assert live.reports[0].lost == 0, live.reports[0].describe()
    [written] = offline_runs(folder / "wb")
    assert written.steps == [0, 1, 2]
    assert not list(temp.glob("gym-artifacts-wandb-dir-*"))
