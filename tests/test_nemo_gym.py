"""Real NeMo Gym 0.7 output (``tests/fixtures/nemo-gym-0.7.0``) exported faithfully.

Coverage from NeMo Gym's own signals in status, report and every backend; failures and planned
inputs exported; levels labelled by their own index; tracker metrics bounded whatever the number
of tasks; NeMo Gym's own exporter's metric names; run names; the partial-run rule.
"""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.cli import main
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.report import build_report
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.mlflow_store import mlflow_sqlite
from tests.nemo_gym_runs import write_run

REPO = Path(__file__).resolve().parent.parent
NEMO_GYM = NEMO_GYM_FIXTURES
OWN_EXPORT = NEMO_GYM / "nemo-gym-own-mlflow-export.txt"
AGENT = "example_single_tool_call_simple_agent"
# expected, scored, missing (no result at all), failed: scored + failed + missing = expected
COVERAGE = {"clean": (10, 10, 0, 0), "with-failures": (10, 8, 0, 2)}



def copy_fixture(name: str, dest: Path) -> Path:
    """A writable copy of one fixture run; returns its ``rollouts.jsonl``."""
    target = dest / name
    shutil.copytree(NEMO_GYM / name, target)
    for p in [target, *target.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return target / "rollouts.jsonl"


def local_cfg(tmp_path: Path) -> Any:
    return OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}}})


def exported_local(run: Path, tmp_path: Path) -> Path:
    [result] = export_run(run, local_cfg(tmp_path))
    assert result.status is ExportStatus.EXPORTED, result.reason
    return tmp_path / "store" / "default" / str(result.backend_run_id)


# -- the generator writes what NeMo Gym writes ---------------------------------------------------------
def test_generated_runs_have_the_fixtures_shape(tmp_path: Path) -> None:
    out = write_run(tmp_path / "rollouts.jsonl", tasks=5, repeats=2, failing_tasks=[4])
    real = NEMO_GYM / "with-failures"
    [ours] = json.loads(out.with_name("rollouts_aggregate_metrics.json").read_text())
    [theirs] = json.loads((real / "rollouts_aggregate_metrics.json").read_text())
    assert list(ours) == list(theirs)
    assert list(ours["agent_metrics"]) == list(theirs["agent_metrics"])
    assert list(ours["group_level_metrics"][0]) == list(theirs["group_level_metrics"][0])
    assert list(ours["repeat_level_metrics"][0]) == list(theirs["repeat_level_metrics"][0])
    assert list(ours["group_level_metrics"][0]["rollout_infos"][0]) == list(
        theirs["group_level_metrics"][0]["rollout_infos"][0]
    )
    for name in ("rollouts.jsonl", "rollouts_failures.jsonl", "rollouts_materialized_inputs.jsonl"):
        mine = [json.loads(x) for x in out.with_name(name).read_text().splitlines()]
        real_rows = [json.loads(x) for x in (real / name).read_text().splitlines()]
        assert len(mine) == len(real_rows) and sorted(mine[0]) == sorted(real_rows[0]), name
    # the statistics are NeMo Gym's (sample std, Student t intervals): same inputs, same figures
    assert ours["group_level_metrics"][-1]["_ng_task_index"] == 3


# -- coverage in status, report and every backend -------------------------------------------------------
@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_status_shows_coverage_and_missing_config(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_fixture(name, tmp_path)
    assert main(["status", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected, scored, missing, failed = COVERAGE[name]
    cov = report["coverage"]
    assert (cov["expected"], cov["scored"], cov["missing"], cov["failed"]) == (
        expected,
        scored,
        missing,
        failed,
    )
    assert cov["expected_from"] == "materialized inputs"
    assert report["missing_for_export"] is None  # every planned rollout has a result
    assert report["config"] is None and "no saved config" in report["config_note"]
    assert {
        "failures.jsonl",
        "materialized_inputs.jsonl",
        "quality_summary.json",
        "rollout_verdicts.jsonl",
    } <= set(report["identities"])
    assert main(["status", str(run)]) == 0
    human = capsys.readouterr().out
    assert f"coverage: {scored} of {expected} planned rollouts scored" in human
    assert ("(2 failed) - partial" in human) == (name == "with-failures")


@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_local_backend_coverage_sidecars_and_levels(name: str, tmp_path: Path) -> None:
    run = copy_fixture(name, tmp_path)
    folder = exported_local(run, tmp_path)
    expected, scored, missing, failed = COVERAGE[name]
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["coverage/expected"], summary["coverage/scored"]) == (expected, scored)
    assert (summary["coverage/missing"], summary["coverage/failed"]) == (missing, failed)
    run_json = json.loads((folder / "run.json").read_text())
    assert run_json["coverage"]["partial"] is (name == "with-failures")
    # the failures, the planned inputs and the quality checker's files, byte for byte
    for exported, source in [
        ("failures.jsonl", "rollouts_failures.jsonl"),
        ("materialized_inputs.jsonl", "rollouts_materialized_inputs.jsonl"),
        ("quality_summary.json", "quality_summary.json"),
        ("rollout_verdicts.jsonl", "rollout_verdicts.jsonl"),
    ]:
        assert (folder / "nemo_gym" / exported).read_bytes() == (NEMO_GYM / name / source).read_bytes()
    # levels keyed by their own index: with task 4 failed, task 4 is missing, nothing shifts
    agg = json.loads(run.with_name("rollouts_aggregate_metrics.json").read_text())[0]
    groups = [
        json.loads(x) for x in (folder / "tables" / "group_level_metrics.jsonl").read_text().splitlines()
    ]
    tasks = [g["_ng_task_index"] for g in groups]
    assert tasks == ([0, 1, 2, 3, 4] if name == "clean" else [0, 1, 2, 3])
    by_task = {g["_ng_task_index"]: g for g in agg["group_level_metrics"]}
    for g in groups:
        assert g["agent"] == AGENT
        assert g["mean/reward"] == by_task[g["_ng_task_index"]]["mean/reward"]
        infos = json.loads(g["rollout_infos"])
        assert {i["_ng_task_index"] for i in infos} == {g["_ng_task_index"]}
    repeats = [
        json.loads(x) for x in (folder / "tables" / "repeat_level_metrics.jsonl").read_text().splitlines()
    ]
    assert [r["_ng_rollout_index"] for r in repeats] == [0, 1]
    assert [r["sample_count"] for r in repeats] == [scored // 2] * 2
    # index fields are labels: never values in the summary
    assert not [
        k for k in summary if "_ng_task_index" in k or "_ng_rollout_index" in k or "level_metrics" in k
    ]
    assert summary[f"{AGENT}/_ng_environment_server"] == "example_single_tool_call_environment_server"
    # named after its folder and stem, not "rollouts"
    assert folder.name.startswith(f"{name.replace('-', '-')}_rollouts-")


def own_export_metrics() -> dict[str, float]:
    """NeMo Gym's own MLflow exporter's final metric values for the clean collection."""
    out = {}
    for line in OWN_EXPORT.read_text().splitlines():
        m = re.match(r"\s+M (\S+) (\S+) steps", line)
        if m and not m.group(1).startswith("progress/"):
            out[m.group(1)] = float(m.group(2))
    return out


@pytest.mark.slow
def test_mlflow_uses_nemo_gyms_own_names_and_exports_sidecars(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "ng"}}}
    )
    client = MlflowClient(uri)
    runs = {}
    for name in ("clean", "with-failures"):
        [result] = export_run(copy_fixture(name, tmp_path), cfg)
        assert result.status is ExportStatus.EXPORTED, result.reason
        runs[name] = client.get_run(result.backend_run_id)
    theirs = own_export_metrics()
    assert len(theirs) == 60  # 63 names less the 3 progress/* step series
    # the headline as metrics (MLflow's runs list), every other statistic in tables/metrics.json
    table = client.download_artifacts(runs["clean"].info.run_id, "tables/metrics.json", str(tmp_path / "m"))
    ours = {**dict(json.loads(Path(table).read_text())["data"]), **runs["clean"].data.metrics}
    assert len(runs["clean"].data.metrics) <= 12
    missing = sorted(set(theirs) - set(ours))
    assert missing == [], missing
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value), key
    failed = runs["with-failures"].data
    for name, run in runs.items():  # 10/10 and 8/10 (2 failed), under NeMo Gym's coverage/* names
        metrics = run.data.metrics
        got = tuple(metrics[f"coverage/{k}"] for k in ("expected", "scored", "missing", "failed"))
        assert got == COVERAGE[name], name
    assert bookkeeping_of(runs["clean"].data.tags)["partial"] == "false"
    assert bookkeeping_of(runs["clean"].data.tags)["coverage"] == "10 of 10 planned rollouts scored"
    assert bookkeeping_of(failed.tags)["partial"] == "true"
    assert bookkeeping_of(failed.tags)["coverage"] == "8 of 10 planned rollouts scored (2 failed) - partial"
    # nothing per rollout or per task among metrics and tags
    for data in (failed, runs["clean"].data):
        names = [*data.metrics, *data.tags]
        assert not [n for n in names if "rollout_infos" in n or "rollout_id" in n or "level_metrics" in n]
        assert not [n for n in names if "/sample/" in n or "_ng_task_index" in n]
    # the run is named after its folder and stem
    assert {r.info.run_name for r in runs.values()} == {"clean/rollouts", "with-failures/rollouts"}
    # sidecars and tables as artifacts
    rid = runs["with-failures"].info.run_id
    files = {f.path for f in client.list_artifacts(rid, "nemo_gym")}
    assert files == {
        "nemo_gym/failures.jsonl",
        "nemo_gym/materialized_inputs.jsonl",
        "nemo_gym/quality_summary.json",
        "nemo_gym/rollout_verdicts.jsonl",
    }
    got = Path(client.download_artifacts(rid, "nemo_gym/failures.jsonl", str(tmp_path / "dl")))
    assert got.read_bytes() == (NEMO_GYM / "with-failures" / "rollouts_failures.jsonl").read_bytes()
    table = Path(client.download_artifacts(rid, "tables/group_level_metrics.json", str(tmp_path / "dl")))
    data = json.loads(table.read_text())
    index = data["columns"].index("_ng_task_index")
    assert [row[index] for row in data["data"]] == [0, 1, 2, 3]


@pytest.mark.slow
def test_metric_count_does_not_grow_with_tasks(tmp_path: Path) -> None:
    """1,000 tasks x 4 repeats in NeMo Gym's format: as many MLflow metrics and tags as 5 x 2."""
    from mlflow import MlflowClient

    uri = mlflow_sqlite(tmp_path / 'mlflow.db')
    cfg = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "ng"}}}
    )
    client = MlflowClient(uri)
    counts = {}
    for tasks, repeats in ((5, 2), (1000, 4)):
        out = write_run(
            tmp_path / f"t{tasks}" / "rollouts.jsonl", tasks=tasks, repeats=repeats, failing_tasks=[3]
        )
        [result] = export_run(out, cfg)
        assert result.status is ExportStatus.EXPORTED, result.reason
        data = client.get_run(result.backend_run_id).data
        counts[tasks] = (len(data.metrics), len([t for t in data.tags if not t.startswith("mlflow.")]))
        assert data.metrics["coverage/expected"] == tasks * repeats
        assert data.metrics["coverage/failed"] == repeats
    assert counts[1000] == counts[5], counts
    assert counts[1000][0] < 100, counts  # O(agents x statistics): 53 + 4 key metrics + coverage


# -- the partial-run rule --------------------------------------------------------------------------------
def test_unfinished_run_is_refused_unless_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_fixture("with-failures", tmp_path)
    run.with_name("rollouts_failures.jsonl").unlink()  # 2 planned rollouts now have no result at all
    [result] = export_run(run, local_cfg(tmp_path))
    assert result.status is ExportStatus.FAILED
    assert "2 of 10 planned rollouts have no result" in (result.reason or "")
    assert not (tmp_path / "store").exists()  # nothing was sent
    assert main(["status", str(run)]) == 0
    assert "exportable: no: 2 of 10 planned rollouts have no result" in capsys.readouterr().out
    run.with_name("rollouts_acceptance.json").write_text(
        json.dumps({"planned_rows": 10, "omitted_rows": 1, "reason": "too few"})
    )
    [result] = export_run(run, local_cfg(tmp_path))
    assert result.status is ExportStatus.FAILED  # accepts fewer rows than are missing
    run.with_name("rollouts_acceptance.json").write_text(
        json.dumps({"planned_rows": 10, "omitted_rows": 2, "reason": "task 4's model server was down"})
    )
    folder = exported_local(run, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["coverage/scored"], summary["coverage/missing"], summary["omitted_rows"]) == (8, 2, 2)
    assert json.loads((folder / "run.json").read_text())["coverage"]["text"].endswith("accepted partial")


def test_run_name_from_the_run_config(tmp_path: Path) -> None:
    run = copy_fixture("clean", tmp_path)
    run.with_name("rollouts_config.yaml").write_text("mlflow_run_name: ng-run\nnum_repeats: 2\n")
    folder = exported_local(run, tmp_path)
    assert folder.name.startswith("ng-run-")


def test_report_shows_coverage_and_levels(tmp_path: Path) -> None:
    run = copy_fixture("with-failures", tmp_path)
    html = build_report(run, tmp_path / "r.html").read_text()
    assert "Coverage: 8 of 10 planned rollouts scored (2 failed) - partial." in html
    assert "group_level_metrics (a row per _ng_task_index)" in html
    assert "<code>key_metrics/&lt;agent&gt;/&lt;metric&gt;</code>" in html
    assert f"<th>{AGENT}</th>" in html and "<td>key_metrics</td><td>mean/reward</td><td>0.5</td>" in html


def test_live_layer_saves_the_config_nemo_gym_does_not(tmp_path: Path) -> None:
    from gym_artifacts.live import live_run

    out = tmp_path / "results" / "rollouts.jsonl"
    config = {
        "policy_api_key": "${oc.env:NG_TEST_KEY,sk-live-canary-123}",
        "mlflow_run_name": "ng-run",
        "exporters": {"local": {"enabled": True, "root": str(tmp_path / "store")}},
    }
    with live_run(config, out) as live:
        live.export_metrics({"progress/total/rollouts_per_min": 10.0}, step=1)
        write_run(out, tasks=3, repeats=2)
    saved = out.with_name("rollouts_config.yaml")
    text = saved.read_text()
    assert "${oc.env:NG_TEST_KEY,sk-live-canary-123}" in text  # unresolved, as NeMo Gym's seed contract says
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    with live_run({**config, "mlflow_run_name": "other"}, out):
        pass
    assert saved.read_text() == text  # the eval's own (or the first) config is never overwritten
    folder = exported_local(out, tmp_path)
    assert folder.name.startswith("ng-run-")  # the run config names the run
    exported = (folder / "config.json").read_text()
    assert "sk-live-canary-123" not in exported and '"policy_api_key":"***"' in exported.replace(" ", "")


def test_sidecars_are_masked_by_value_not_by_key(tmp_path: Path) -> None:
    """A config secret echoed into the failures sidecar is masked; the quality summary's counts
    under keys like ``tokens`` are NeMo Gym's numbers and stay as written."""
    run = copy_fixture("with-failures", tmp_path)
    secret = "sk-sidecar-canary-98765"
    run.with_name("rollouts_config.yaml").write_text(f"policy_api_key: {secret}\n")
    failures = run.with_name("rollouts_failures.jsonl")
    failures.write_text(failures.read_text().replace("Internal Server Error", f"bad key {secret}"))
    folder = exported_local(run, tmp_path)
    exported = (folder / "nemo_gym" / "failures.jsonl").read_text()
    assert secret not in exported and "bad key ***" in exported
    summary = (folder / "nemo_gym" / "quality_summary.json").read_bytes()
    assert summary == (NEMO_GYM / "with-failures" / "quality_summary.json").read_bytes()
