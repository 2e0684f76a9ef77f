"""Attacks on the planned inputs as an MLflow evaluation dataset on a database store
(``exporters/_mlflow_views.evaluation_dataset``): a run name with quotes, and planned inputs
whose text a secret mask applied to escaped JSON would tear."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.mlflow_store import mlflow_sqlite

CANARY = "sk-dataset-canary-5e2b9c"


def fixture_run(tmp_path: Path, folder: str = "runs") -> Path:
    target = tmp_path / folder / "with-failures"
    shutil.copytree(NEMO_GYM_FIXTURES / "with-failures", target)
    for p in [target, *target.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return target / "rollouts.jsonl"


def set_input_text(rollouts: Path, texts: list[str]) -> None:
    """The user message of the first planned inputs replaced by ``texts``."""
    inputs = rollouts.with_name("rollouts_materialized_inputs.jsonl")
    lines = inputs.read_text().splitlines()
    for i, text in enumerate(texts):
        record = json.loads(lines[i])
        record["responses_create_params"]["input"][-1]["content"] = text
        lines[i] = json.dumps(record)
    inputs.write_text("\n".join(lines) + "\n")


def sqlite_cfg(tmp_path: Path, **settings: Any) -> Any:
    section = {"enabled": True, "tracking_uri": mlflow_sqlite(tmp_path / 'm.db'), "experiment_name": "datasets",
               "log_traces": False, **settings}  # fmt: skip
    return OmegaConf.create({"exporters": {"mlflow": section}})


def dataset_records(tmp_path: Path, run_id: str) -> tuple[list[Any], list[Any]]:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = mlflow_sqlite(tmp_path / 'm.db')
    client = MlflowClient(uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    datasets = client.search_datasets([experiment_id])
    store = SqlAlchemyStore(uri, str(tmp_path / "artifacts"))
    records = [r for d in datasets for r in store._load_dataset_records(d.dataset_id)[0]]
    return datasets, records


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["it's an eval", "back\\slash eval", "both ' and \" eval"])
def test_two_evals_of_a_quoted_run_name_share_one_evaluation_dataset(tmp_path: Path, run_name: str) -> None:
    """Two evals of one run name into one experiment share its evaluation dataset, found by name
    before it is created: a name with a quote or a backslash must be found too, else each export
    adds another dataset of the same name (and the shared records again)."""
    cfg = sqlite_cfg(tmp_path, run_name=run_name)
    first, second = fixture_run(tmp_path, "a"), fixture_run(tmp_path, "b")
    set_input_text(second, ["a task only the second eval planned"])  # another run's content
    [result] = export_run(first, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    [other] = export_run(second, cfg)
    assert other.status is ExportStatus.EXPORTED, other.reason
    assert other.backend_run_id != result.backend_run_id
    datasets, records = dataset_records(tmp_path, result.backend_run_id)
    assert [d.name for d in datasets] == [f"{run_name} planned inputs"]
    assert len(records) == 11  # the 10 planned inputs, one of them changed in the second run


@pytest.mark.slow
def test_planned_inputs_with_shell_quotes_and_a_secret_land_masked(tmp_path: Path) -> None:
    """A planned input quoting a command line (``--api-key "x"``, ``token=a\\"b``) while the run
    has a secret: masking the escaped JSON text of a batch tears it (the mask swallows an escaped
    quote) and the whole MLflow export fails. Masked in the decoded records instead, it lands,
    the secret masked, the rest as written."""
    rollouts = fixture_run(tmp_path)
    set_input_text(rollouts, [f'run it with --api-key "x" and {CANARY}', 'token=abc" ,"x":1', 'secret: a\\"b'])
    config = tmp_path / "nemo_gym_config.yaml"
    config.write_text(f"policy_api_key: {CANARY}\n")
    [result] = export_run(rollouts, sqlite_cfg(tmp_path), nemo_gym_config=config)
    assert result.status is ExportStatus.EXPORTED, result.reason
    _, records = dataset_records(tmp_path, result.backend_run_id)
    assert len(records) == 10
    dumped = json.dumps([r.inputs for r in records])
    assert CANARY not in dumped
    contents = {r.inputs["responses_create_params"]["input"][-1]["content"] for r in records}
    assert 'run it with --api-key "***" and ***' in contents  # each string masked on its own


@pytest.mark.slow
def test_two_exports_at_once_fill_one_evaluation_dataset_of_a_fresh_store(tmp_path: Path) -> None:
    """Two exports of one run name into one fresh SQLite store at the same time (``--jobs 2``
    over two evals of one benchmark): both look the dataset up, both upsert the same planned
    inputs. Neither may fail on the other's rows (MLflow's unique input hash) and the store ends
    with one dataset holding each input once. Repeated a few times: the race is real, not staged."""
    import threading
    from types import SimpleNamespace

    from exporters._mlflow_client import RequestLimits, ScopedMlflow
    from exporters._mlflow_views import evaluation_dataset

    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(json.dumps({"task": i, "pad": "x" * 100}) + "\n" for i in range(3000)))
    payload = SimpleNamespace(run=SimpleNamespace(materialized_inputs_fpath=inputs), secrets=frozenset())
    for attempt in range(3):
        uri = f"sqlite:///{tmp_path / f'race{attempt}.db'}"
        experiment_id = MlflowClient(uri).create_experiment("datasets")
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def export(uri: str = uri, experiment_id: str = experiment_id, barrier: Any = barrier,
                   errors: list[BaseException] = errors) -> None:  # fmt: skip
            try:
                ml = ScopedMlflow(uri, None, RequestLimits(timeout=30, retries=0))
                barrier.wait(30)
                evaluation_dataset(ml, experiment_id, "shared planned inputs", payload)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=export) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        assert not any(t.is_alive() for t in threads), "an upsert hung"
        assert not errors, errors
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        datasets = MlflowClient(uri).search_datasets([experiment_id])
        assert [d.name for d in datasets] == ["shared planned inputs"], [(d.dataset_id, d.created_time) for d in datasets]
        store = SqlAlchemyStore(uri, str(tmp_path / "artifacts"))
        assert len(store._load_dataset_records(datasets[0].dataset_id)[0]) == 3000


@pytest.mark.slow
def test_a_database_stores_traces_get_their_deadline_after_a_long_export_before_them(tmp_path: Path) -> None:
    """On a database store ``export_deadline`` bounds the traces' part only (MLflow's server
    started for them, then each batch; docs/backends/mlflow.md): an export whose earlier part
    (an evaluation dataset of 500,000 planned inputs at ~1.5 ms a record, a large table) took
    longer than the deadline while its store answered all along must still start the server and
    send its traces, not fail at once on a deadline counted from the export's start. The earlier
    part's time is the deadline's clock moved on (a real one would take minutes)."""
    import time

    from exporters._mlflow_client import Deadline
    from exporters.mlflow import MlflowExporter, MlflowSettings
    from gym_artifacts.contract.hooks import ExportPlan
    from gym_artifacts.contract.run_payload import RunPayload
    from gym_artifacts.run.artifacts import RunArtifacts

    rollouts = fixture_run(tmp_path)
    uri = mlflow_sqlite(tmp_path / 'm.db')
    exporter = MlflowExporter(MlflowSettings(tracking_uri=uri, export_deadline=180, log_traces=True))
    ml = exporter._client(live=False)
    experiment_id = ml.client.create_experiment("late traces")
    run_id = ml.client.create_run(experiment_id).info.run_id
    plan = ExportPlan({}, "b3:late", upload_rollouts=True)
    payload = RunPayload.of(RunArtifacts.from_path(rollouts), plan)
    assert isinstance(ml.deadline, Deadline) and ml.deadline.at is not None
    ml.deadline.at = time.monotonic() - 1  # 181 s of the export before its traces have passed
    assert exporter._log_traces(ml, run_id, payload, 0, plan).traces == 10


@pytest.mark.slow
def test_a_large_evaluation_dataset_on_a_server_is_bounded_per_batch(mlflow_server: Any, tmp_path: Path) -> None:
    """``export_deadline`` bounds a stall, not a large export: an evaluation dataset of many
    planned inputs that a real ``mlflow server`` takes 1,000 records at a time, each batch in
    well under the deadline, must not fail at the deadline counted from its start (both the
    client's request deadline and the export's watched one restart at each batch it took)."""
    import time
    from types import SimpleNamespace

    from exporters._mlflow_client import RequestLimits, ScopedMlflow
    from exporters._mlflow_views import RECORDS, evaluation_dataset
    from gym_artifacts.core.watchdog import run_watched

    deadline = 4.0
    inputs = tmp_path / "inputs.jsonl"
    rows = 12 * RECORDS
    inputs.write_text("".join(json.dumps({"task": i, "pad": "x" * 100}) + "\n" for i in range(rows)))
    payload = SimpleNamespace(run=SimpleNamespace(materialized_inputs_fpath=inputs), secrets=frozenset())
    ml = ScopedMlflow(mlflow_server.uri, None, RequestLimits(timeout=30, retries=0, deadline=deadline))
    experiment_id = ml.client.create_experiment(f"large dataset {tmp_path.name}")
    start = time.monotonic()
    dataset_id = run_watched(lambda: evaluation_dataset(ml, experiment_id, "large planned inputs", payload),
                             deadline, "mlflow", server=mlflow_server.uri)  # fmt: skip
    took = time.monotonic() - start
    reader = ScopedMlflow(mlflow_server.uri, None, RequestLimits(timeout=60, retries=2))
    records = len(reader.client._tracking_client.store._load_dataset_records(dataset_id)[0])
    assert records == rows
    assert took > deadline, f"{took:.1f} s: make the dataset larger so it outlasts the deadline"
