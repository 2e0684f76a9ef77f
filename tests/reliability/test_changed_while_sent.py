"""A run whose files change while a backend sends them (the eval still writing, a user editing a
file) is never sealed as exported: no receipt, and no backend run left marked complete with an
identity its content does not have (a later export of an untouched copy would otherwise find it
"already exported"). Checked for the two backends that tag their run last (local, MLflow), for
a change of size and for a same-size rewrite whose modification time is put back."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.contract.hooks import ExportPlan, ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities, run_identity
from tests.mlflow_store import mlflow_sqlite


def same_size_rewrite(fpath: Path) -> None:
    """One digit of the first line's first number changed, size and modification time kept."""
    st = fpath.stat()
    data = bytearray(fpath.read_bytes())
    i = next(i for i, c in enumerate(data) if chr(c).isdigit())
    data[i] = ord("7") if data[i] != ord("7") else ord("3")
    fpath.write_bytes(bytes(data))
    os.utime(fpath, ns=(st.st_atime_ns, st.st_mtime_ns))


def truncate_to_half(fpath: Path) -> None:
    lines = fpath.read_bytes().splitlines(keepends=True)
    fpath.write_bytes(b"".join(lines[: len(lines) // 2]))


CHANGES: dict[str, Callable[[Path], None]] = {"same-size": same_size_rewrite, "truncated": truncate_to_half}


def change_before_the_final_tag(monkeypatch: pytest.MonkeyPatch, rollouts: Path, change: Callable[[Path], None]) -> None:
    """The backend has sent the run and is about to tag it with its identity: change the rollouts."""
    real = ExportPlan.complete_or_undo
    done: list[bool] = []

    def changed_then_complete(self: ExportPlan, undo: Callable[[], None]) -> ExportPlan:
        if not done:
            done.append(True)
            change(rollouts)
        return real(self, undo)

    monkeypatch.setattr(ExportPlan, "complete_or_undo", changed_then_complete)


def cfg_for(backend: str, tmp_path: Path) -> Any:
    section: dict[str, Any] = {"enabled": True, "report": "off"}
    if backend == "mlflow":
        section["tracking_uri"] = mlflow_sqlite(tmp_path / 'm.db')
    else:
        section["root"] = str(tmp_path / "store")
    return OmegaConf.create({"exporters": {backend: section}})


def complete_runs(backend: str, tmp_path: Path) -> list[tuple[str, str]]:
    """(backend run, identity) of every run the backend holds as complete."""
    if backend == "mlflow":
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient(mlflow_sqlite(tmp_path / 'm.db'))
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], run_view_type=ViewType.ALL)
        kept = [r for r in runs if r.info.lifecycle_stage == "active" and bookkeeping_of(r.data.tags).get("complete") == "true"]
        return [(r.info.run_id, bookkeeping_of(r.data.tags)["identity"]) for r in kept]
    folders = [p for p in (tmp_path / "store").rglob("run.json")]
    return [(p.parent.name, json.loads(p.read_text()).get("run_identity", "")) for p in folders]


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("backend", ["local", "mlflow"])
def test_a_run_changed_while_sent_is_never_sealed(
    backend: str, change: str, quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = cfg_for(backend, tmp_path)
    original = quickstart_run.read_bytes()
    with monkeypatch.context() as patch:
        change_before_the_final_tag(patch, quickstart_run, CHANGES[change])
        [result] = export_run(quickstart_run, cfg)
    assert result.status is ExportStatus.FAILED and "changed" in (result.reason or ""), result
    run = RunArtifacts.from_path(quickstart_run)
    assert not run.export_done_fpath(backend).exists()
    assert complete_runs(backend, tmp_path) == []  # nothing left that claims the old content
    if change == "truncated":  # half a run is not exportable as it is: the eval finished writing it
        quickstart_run.write_bytes(original)
    # the run as it is now exports once, and its backend run holds what the files hold now
    [again] = export_run(quickstart_run, cfg)
    assert again.status is ExportStatus.EXPORTED, again.reason
    now = run_identity(content_identities(run))
    assert [identity for _, identity in complete_runs(backend, tmp_path)] == [now]
