"""The local backend: folder layout, content, hard links, reactor-runtime 2.7.6 folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from tests.media import decode_frame_count
from tests.processes import reaped


def local_cfg(root: Path) -> object:
    return OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(root)}}})


def test_post_run_folder_content(quickstart_run: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    [result] = export_run(quickstart_run, local_cfg(store))
    assert result.status is ExportStatus.EXPORTED, result.reason
    folder = store / "default" / result.backend_run_id
    run_json = json.loads((folder / "run.json").read_text())
    assert run_json["status"] == "FINISHED" and run_json["rows"] == 300
    assert run_json["identities"]["rollouts.jsonl"].startswith("b3:")
    summary = json.loads((folder / "summary.json").read_text())
    agg = json.loads(quickstart_run.with_name("eval_aggregate_metrics.json").read_text())
    # NeMo Gym's own exporter's names; the per-task and per-repeat levels are tables, not values
    assert summary["travel_simple_agent/mean/reward"] == agg[1]["agent_metrics"]["mean/reward"]
    assert summary["key_metrics/travel_simple_agent/mean/reward"] == agg[1]["key_metrics"]["mean/reward"]
    assert summary["travel_simple_agent/_ng_environment_server"] == "travel_environment_server"
    assert not any("group_level" in k or "repeat_level" in k or "rollout_infos" in k for k in summary)
    assert summary["coverage/expected"] == summary["coverage/scored"] == 300
    assert summary["coverage/missing"] == summary["coverage/failed"] == 0
    groups = [
        json.loads(x) for x in (folder / "tables" / "group_level_metrics.jsonl").read_text().splitlines()
    ]
    assert len(groups) == 75 and sorted(g["_ng_task_index"] for g in groups) == list(range(75))
    repeats = (folder / "tables" / "repeat_level_metrics.jsonl").read_text().splitlines()
    assert len(repeats) == 3 * 4
    assert (folder / "nemo_gym" / "materialized_inputs.jsonl").read_bytes() == quickstart_run.with_name(
        "eval_materialized_inputs.jsonl"
    ).read_bytes()
    assert run_json["coverage"]["text"] == "300 of 300 planned rollouts scored"
    assert summary["omitted_rows"] == 0
    journal = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    source = [
        json.loads(line) for line in quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()
    ]
    assert [(j["step"], j["time"], j["metrics"]) for j in journal] == [
        (s["step"], s["time"], s["metrics"]) for s in source
    ]
    # Rollouts and artifacts are the run's own bytes, in snapshot copies (never hard links).
    assert (folder / "rollouts.jsonl").read_bytes() == quickstart_run.read_bytes()
    assert not os.path.samefile(folder / "rollouts.jsonl", quickstart_run)
    rec = folder / "artifacts" / "recording.mp4"
    assert rec.read_bytes() == (quickstart_run.with_name("eval_artifacts") / "recording.mp4").read_bytes()
    assert decode_frame_count(rec) == 30
    assert not list(folder.rglob(".gymart-tmp*"))


def test_acceptance_partial_is_exported(quickstart_run: Path, tmp_path: Path) -> None:
    acc = quickstart_run.with_name("eval_acceptance.json")
    acc.write_text('{"planned_rows": 320, "omitted_rows": 20, "reason": "judge outage"}')
    run = RunArtifacts.from_path(quickstart_run)
    assert run.omitted_rows() == 20
    [result] = export_run(run, local_cfg(tmp_path / "store"))
    folder = tmp_path / "store" / "default" / result.backend_run_id
    assert json.loads((folder / "summary.json").read_text())["omitted_rows"] == 20
    assert json.loads((folder / "acceptance.json").read_text())["reason"] == "judge outage"


def test_bad_acceptance_fails_naming_key(quickstart_run: Path, tmp_path: Path) -> None:
    quickstart_run.with_name("eval_acceptance.json").write_text(
        '{"planned_rows": 3, "omitted_rows": -1, "reason": "x"}'
    )
    [result] = export_run(quickstart_run, local_cfg(tmp_path / "store"))
    assert result.status is ExportStatus.FAILED
    assert "eval_acceptance.json: invalid acceptance record at omitted_rows" in (result.reason or "")


@pytest.mark.slow
def test_retry_after_crash_reuses_the_same_folder(quickstart_run: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = RunArtifacts.from_path(quickstart_run)
    [first] = export_run(run, local_cfg(store))
    run.export_done_fpath("local").unlink()  # as if the process died before the receipt
    [second] = export_run(run, local_cfg(store))
    assert second.status is ExportStatus.EXPORTED
    assert second.backend_run_id == first.backend_run_id
    assert len(list((store / "default").iterdir())) == 1


@pytest.mark.parametrize("name", ["with-gpu-samples", "no-gpu"])
def test_reactor_folders_export_unchanged(reactor_fixture, tmp_path: Path, name: str) -> None:
    folder = reactor_fixture(name)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    store = tmp_path / "store"
    [result] = export_run(folder, local_cfg(store))
    assert result.status is ExportStatus.EXPORTED, result.reason
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    exported = store / "default" / result.backend_run_id / "artifacts"
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
    assert decode_frame_count(exported / "recording.mp4") == 30
    assert Path(f"{folder}_local_export_done.json").is_file()
    [again] = export_run(folder, local_cfg(store))
    assert again.status is ExportStatus.SKIPPED


def test_copy_when_not_linkable(
    quickstart_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(*_args: object, **_kwargs: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    [result] = export_run(quickstart_run, local_cfg(tmp_path / "store"))
    assert result.status is ExportStatus.EXPORTED
    copy = tmp_path / "store" / "default" / result.backend_run_id / "rollouts.jsonl"
    assert copy.read_bytes() == quickstart_run.read_bytes()
    assert not os.path.samefile(copy, quickstart_run)


def test_copies_of_a_run_in_differently_named_folders_end_in_one_local_folder(make_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The folder is named after the first copy exported; later copies (other folder names, same
    content) are that folder, whether their identity is hashed while copying or known first,
    and two processes at once (the identity lock orders them) end there too."""
    import subprocess
    import sys

    root = tmp_path / "store"
    cfg = OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(root), "report": "off"}}})
    first, second = make_run(), make_run()
    [a] = export_run(first, cfg)
    [b] = export_run(second, cfg)  # cold: hashed while copying
    [b_again] = export_run(second, cfg)  # the receipt: skipped
    assert (a.status, b.status) == (ExportStatus.EXPORTED, ExportStatus.EXPORTED), (a, b)
    assert b_again.status is ExportStatus.SKIPPED
    assert a.backend_run_id == b.backend_run_id
    both = [make_run(), make_run()]
    script = (
        "import sys; from omegaconf import OmegaConf; from gym_artifacts import export_run; "
        f"cfg = OmegaConf.create({{'exporters': {{'local': {{'enabled': True, 'root': {str(root)!r}, 'report': 'off'}}}}}}); "
        "[r] = export_run(sys.argv[1], cfg); print(r.status.value, r.backend_run_id)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p)], stdout=subprocess.PIPE, text=True) for p in both]
    with reaped(procs):
        outs = [p.communicate(timeout=180)[0].split() for p in procs]
    assert [o[0] for o in outs] == ["EXPORTED", "EXPORTED"] and {o[1] for o in outs} == {a.backend_run_id}, outs
    folders = [p.name for p in (root / "default").iterdir()]
    assert folders == [a.backend_run_id], folders  # one folder, no .sending- left
