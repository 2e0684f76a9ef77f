"""One definition of a run's coverage in every place it is shown (issue 39): ``coverage/missing``
is the planned rollouts with no result at all, so ``scored + failed + missing = planned``.

NeMo Gym itself logs ``coverage/missing = expected - scored`` at the end of a collection (its
failed rollouts counted as missing, beside this project's ``coverage/failed``: every failure
read as lost twice). Here a run of any planned / scored / failed counts goes through NeMo Gym's
own calls to the live drop-in (MLflow on SQLite, W&B offline), then a post-run export to every
built-in backend; each backend's stored value is read back from the backend (MLflow's metric
history, W&B's offline history and summary, TensorBoard's event files, the local folder,
LangSmith's project metadata through its client, Phoenix's experiment through its server).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from gym_artifacts import export_run, nemo_gym
from gym_artifacts.contract.hooks import ExportStatus
from tests.fixture_paths import NEMO_GYM_FIXTURES

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboard")
pytest.importorskip("langsmith")

from langsmith import Client as LangsmithClient
from mlflow.tracking import MlflowClient
from phoenix.client import Client as PhoenixClient

from tests.langsmith_api import LangsmithApi
from tests.mlflow_store import mlflow_sqlite
from tests.test_tensorboard import read_run
from tests.wandb_records import offline_runs

FIXTURE = NEMO_GYM_FIXTURES / "with-failures"


def lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURE / name).read_text().splitlines()]


def write_run(folder: Path, planned: int, scored: int, failed: int) -> Path:
    """A NeMo Gym run of ``planned`` rollouts (task i, repeat 0): the first ``scored`` in
    ``rollouts.jsonl``, the next ``failed`` in the failures sidecar, the rest with no result (an
    accepted partial, so the run exports); lines are the real with-failures fixture's."""
    folder.mkdir(parents=True)
    out = folder / "rollouts.jsonl"
    inputs, rollouts, failures = (lines(f"rollouts{s}.jsonl") for s in ("_materialized_inputs", "", "_failures"))

    def placed(records: list[dict[str, Any]], tasks: range) -> str:
        rows = [{**records[i % len(records)], "_ng_task_index": t, "_ng_rollout_index": 0} for i, t in enumerate(tasks)]
        return "".join(json.dumps(r) + "\n" for r in rows)

    (folder / "rollouts_materialized_inputs.jsonl").write_text(placed(inputs, range(planned)))
    out.write_text(placed(rollouts, range(scored)))
    (folder / "rollouts_failures.jsonl").write_text(placed(failures, range(scored, scored + failed)))
    shutil.copy(FIXTURE / "rollouts_aggregate_metrics.json", folder)  # its figures are not the point
    if planned - scored - failed:
        acceptance = {"planned_rows": planned, "omitted_rows": planned - scored - failed, "reason": "test"}
        (folder / "rollouts_acceptance.json").write_text(json.dumps(acceptance))
    return out


def live_drop_in(out: Path, folder: Path, planned: int, scored: int) -> dict[str, Any]:
    """NeMo Gym's calls at the end of a collection, through the drop-in; returns its config."""
    config = {
        "output_jsonl_fpath": str(out),
        "results_dir": str(folder),
        "wandb_project": "ng", "wandb_name": "ng-run", "wandb_api_key": "wandb-secret-key-0123456789",
        "mlflow_tracking_uri": mlflow_sqlite(folder / 'mlflow.db'),
        "mlflow_experiment_name": "coverage", "mlflow_run_name": "ng-run",
        "exporters": {"wandb": {"mode": "offline"}},
    }  # fmt: skip
    assert sorted(e.name for e in nemo_gym.setup_exporters(config)) == ["mlflow", "wandb"]
    # rollout_collection.py, after the collection: its own coverage figures
    nemo_gym.export_metrics(
        {"coverage/expected": planned, "coverage/scored": scored, "coverage/missing": planned - scored}
    )
    nemo_gym.teardown_exporters()
    return config


def stored_coverage(folder: Path, config: dict[str, Any], phoenix_url: str) -> dict[str, list[Any]]:
    """Export the run to every built-in backend; each backend's ``coverage/missing`` values."""
    api = LangsmithApi().start()
    try:
        cfg = nemo_gym.drop_in_config(config)
        cfg["exporters"].update({
            "tensorboard": {"enabled": True, "logdir": str(folder / "tb")},
            "local": {"enabled": True, "root": str(folder / "local")},
            "langsmith": {"enabled": True, "api_url": api.url, "api_key": "lsv2_pt_k"},
            "phoenix": {"enabled": True, "base_url": phoenix_url, "dataset_name": f"cov-{folder.name}"},
        })  # fmt: skip
        results = {r.exporter: r for r in export_run(Path(config["output_jsonl_fpath"]), OmegaConf.create(cfg))}
        assert all(r.status is ExportStatus.EXPORTED for r in results.values()), results
        project = LangsmithClient(api_url=api.url, api_key="lsv2_pt_k", auto_batch_tracing=False).read_project(
            project_id=results["langsmith"].backend_run_id
        )
    finally:
        api.stop()
    found: dict[str, list[Any]] = {}
    mlflow = MlflowClient(config["mlflow_tracking_uri"])
    history = mlflow.get_metric_history(results["mlflow"].backend_run_id, "coverage/missing")
    found["mlflow"] = [m.value for m in history]
    runs = offline_runs(folder / "wandb")
    found["wandb history"] = [row["coverage/missing"] for r in runs for row in r.history if "coverage/missing" in row]
    found["wandb summary"] = [r.summary["coverage/missing"] for r in runs if r.run_id == results["wandb"].backend_run_id]
    tb = read_run(folder / "tb" / results["tensorboard"].backend_run_id)
    found["tensorboard"] = [e.value for e in tb.Scalars("coverage/missing")]
    local = next((folder / "local").rglob("run.json")).parent
    found["local run.json"] = [json.loads((local / "run.json").read_text())["coverage"]["missing"]]
    journal = local / "metrics.jsonl"
    if journal.is_file():
        found["local journal"] = [
            json.loads(line)["metrics"]["coverage/missing"]
            for line in journal.read_text().splitlines()
            if "coverage/missing" in json.loads(line).get("metrics", {})
        ]
    found["langsmith"] = [project.metadata["coverage"]["coverage/missing"]]
    experiment = PhoenixClient(base_url=phoenix_url).experiments.get(experiment_id=results["phoenix"].backend_run_id)
    found["phoenix"] = [experiment["metadata"]["coverage"]["coverage/missing"]]
    return found


# planned, scored (at least one: a run with no rollouts is refused, not exported), failed
COUNTS = st.integers(1, 12).flatmap(
    lambda planned: st.integers(1, planned).flatmap(
        lambda scored: st.tuples(st.just(planned), st.just(scored), st.integers(0, planned - scored))
    )
)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(counts=(10, 8, 2))  # the with-failures fixture: 2 failed read as 2, not 4 lost
@example(counts=(10, 5, 2))  # 3 planned rollouts with no result at all (an accepted partial)
@given(counts=COUNTS)
def test_missing_means_no_result_at_all_in_every_backend_live_and_after(
    counts: tuple[int, int, int], tmp_path_factory: pytest.TempPathFactory, phoenix_server: Any
) -> None:
    planned, scored, failed = counts
    folder = tmp_path_factory.mktemp("coverage") / "run"
    try:
        out = write_run(folder, planned, scored, failed)
        config = live_drop_in(out, folder, planned, scored)
        found = stored_coverage(folder, config, phoenix_server.url)
    finally:
        nemo_gym.teardown_exporters()
    missing = planned - scored - failed
    assert found and all(values for values in found.values()), found
    assert {name: set(values) for name, values in found.items()} == {name: {missing} for name in found}
    shutil.rmtree(folder.parent, ignore_errors=True)


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.lists(st.integers(), max_size=2),
)  # fmt: skip


@given(expected=ANY_VALUE, scored=ANY_VALUE, missing=ANY_VALUE, failed=st.one_of(st.none(), st.integers(0, 2**40)))
def test_nemo_gyms_coverage_figures_restated_or_left_whatever_they_hold(
    expected: Any, scored: Any, missing: Any, failed: int | None
) -> None:
    """Any values NeMo Gym (or anything else) logs under its coverage names: counts are restated
    so that they add up (missing never below 0), anything else is left as it came; never raises."""
    from gym_artifacts.run.coverage import nemo_gym_coverage

    metrics = {"coverage/expected": expected, "coverage/scored": scored, "coverage/missing": missing}
    figures = nemo_gym_coverage(metrics, failed)
    counts = [v for v in (expected, scored) if not isinstance(v, bool) and isinstance(v, int | float)]
    if figures is None:
        assert len(counts) < 2 or not all(float(v).is_integer() and v >= 0 for v in counts)
        return
    e, s = int(expected), int(scored)
    assert figures["coverage/expected"] == e and figures["coverage/scored"] == s
    assert figures["coverage/missing"] == max(e - s - (failed or 0), 0)
    assert ("coverage/failed" in figures) == (failed is not None)
