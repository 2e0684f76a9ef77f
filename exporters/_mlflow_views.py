"""What MLflow's run views show for an eval beyond metrics: the planned inputs as the run's
dataset input, a one-line headline as the run's description (the HTML report, uploaded after
the receipt, is ``_mlflow_report``'s).

Public MLflow entities only (``mlflow.entities.Dataset``/``DatasetInput``, logged with
``MlflowClient.log_inputs``); the SDK is imported when a view is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_artifacts.plugin import RunPayload

logger = logging.getLogger(__name__)

DESCRIPTION_TAG = "mlflow.note.content"  # what MLflow's run page shows as the description
DATASET_CONTEXT = "eval"
_READ = 1 << 20


def _digest_and_rows(fpath: Path) -> tuple[str, int, list[str]]:
    """A short content digest, the line count and the first line's keys (streamed)."""
    digest = hashlib.sha256()
    rows = 0
    last = b"\n"
    with open(fpath, "rb") as fh:
        first = fh.readline(_READ)
        fh.seek(0)
        for chunk in iter(lambda: fh.read(_READ), b""):
            digest.update(chunk)
            rows += chunk.count(b"\n")
            last = chunk[-1:]
    rows += last != b"\n"  # a last line without its newline
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    keys = [str(k) for k in record] if isinstance(record, dict) else []
    return digest.hexdigest()[:16], rows, keys


def planned_inputs(payload: RunPayload, name: str) -> Any | None:
    """The run's planned inputs (``OUT_materialized_inputs.jsonl``) as a ``DatasetInput`` with
    context ``eval``, or None when the run has none: MLflow's runs list and run page show it."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    fpath = payload.run.materialized_inputs_fpath
    if not fpath.is_file() or fpath.stat().st_size == 0:
        return None
    digest, rows, keys = _digest_and_rows(fpath)
    schema = {"mlflow_colspec": [{"type": "string", "name": k, "required": False} for k in keys]}
    dataset = Dataset(
        name=name[:500],
        digest=digest,
        source_type="local",
        source=json.dumps({"uri": fpath.resolve().as_uri()}),
        schema=json.dumps(schema),
        profile=json.dumps({"num_rows": rows}),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", DATASET_CONTEXT)])


RECORDS = 1000  # evaluation dataset records a request
DATASET_LOCK_WAIT_S = 120.0  # how long an export waits for another to look its dataset up


def _same_name(ml: Any, experiment_id: str, name: str) -> Any | None:
    """The experiment's evaluation dataset named exactly ``name`` (the oldest, should two exports
    at once have made one each: every export picks the same one), or None. MLflow's filter
    parser keeps a quoted value's characters as written (no escapes): a name is compared with
    ``=`` inside a quote it does not hold, else (both quotes, a backslash: an escape in some
    databases' LIKE) matched by a LIKE with those characters as ``_`` wildcards; every candidate
    is compared exactly here (a LIKE may match more, case-insensitively on SQLite)."""
    if "\\" not in name and ("'" not in name or '"' not in name):
        quote = "'" if "'" not in name else '"'
        condition = f"name = {quote}{name}{quote}"
    else:
        condition = "name LIKE '" + "".join("_" if c in "'\"\\" else c for c in name) + "'"
    token = None
    same: list[Any] = []
    while True:
        page = ml.client.search_datasets(
            [experiment_id], filter_string=condition, max_results=100, page_token=token
        )
        same.extend(dataset for dataset in page if dataset.name == name)
        token = page.token
        if not token:
            return min(same, key=lambda d: (d.created_time or 0, d.dataset_id), default=None)


def _dataset_of(ml: Any, experiment_id: str, name: str) -> Any:
    """The experiment's dataset ``name``, made when missing; looked up and made under one lock
    per store, experiment and name, so two exports at once on this machine (``--jobs``, two
    commands into one SQLite store) never make one each."""
    from gym_artifacts.plugin import exclusive_lock, shared_lock_fpath

    lock = shared_lock_fpath("mlflow evaluation dataset", ml.tracking_uri, experiment_id, name)
    with exclusive_lock(lock, wait_seconds=DATASET_LOCK_WAIT_S):
        found = _same_name(ml, experiment_id, name)
        return found if found is not None else ml.client.create_dataset(name, experiment_id=[experiment_id])


def evaluation_dataset(ml: Any, experiment_id: str, name: str, payload: RunPayload) -> str | None:
    """The planned inputs as an MLflow evaluation dataset of the experiment (MLflow's Datasets
    page), on an ``mlflow server`` and on a database store alike. Found by name before it is
    created; records are upserted by their inputs, so a rerun adds none twice. Returns the
    dataset's id, or None when the run has no planned inputs.

    The records go through the store of the exporter's scoped client (``upsert_dataset_records``:
    MLflow's REST ``datasets/{id}/records`` on a server, MLflow's own SQL store code on a database
    store), the call ``EvaluationDataset.merge_records`` makes on the process-wide store; never
    the process-wide tracking URI, never MLflow's tables directly."""
    from gym_artifacts.plugin import iter_jsonl, mask_values

    fpath = payload.run.materialized_inputs_fpath
    if not fpath.is_file():
        return None
    dataset = _dataset_of(ml, experiment_id, name)
    store = ml.client._tracking_client.store  # the scoped client's store (REST or SQL)
    batch: list[dict[str, Any]] = []
    secrets = payload.secrets

    def flush() -> None:
        try:
            store.upsert_dataset_records(dataset.dataset_id, batch)
        except Exception:  # once more, see below
            # another export upserting the same inputs at once inserted some first (MLflow's
            # unique input hash refuses the second insert): now found, they are merged
            logger.info("mlflow: evaluation dataset records refused once; upserting them again")
            store.upsert_dataset_records(dataset.dataset_id, batch)
        batch.clear()
        ml.progress()  # the export's deadline bounds a stalled server, not the number of inputs

    for _, record in iter_jsonl(fpath, "materialized inputs JSONL"):
        if secrets:  # masked in the decoded record: a mask in escaped JSON text could tear it
            record = mask_values(record, secrets)
        batch.append({"inputs": record if isinstance(record, dict) else {"input": record}})
        if len(batch) == RECORDS:
            flush()
    if batch:
        flush()
    return str(dataset.dataset_id)
