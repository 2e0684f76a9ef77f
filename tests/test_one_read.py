"""One read of the rollouts per export (issue 43).

A cold export (no identity cache, no receipt) used to parse the rollouts file several times: the
send key's bytes and record counts, the identity workers, ``params_from_files`` for a run that
saved no config, TensorBoard's own pass. Counted here through ``rchar`` of ``/proc/self/io``
(every byte this process and its reaped workers read, from any file), on a NeMo Gym-shaped run
whose rollouts are padded so that they are nearly all the run's bytes: per backend set, the
export reads at most 1.1x the rollouts' size, plus one read of the file for each backend that
ships the file itself (the local copy, MLflow's artifact upload: what moving the bytes costs),
plus the other files of the run a few times over.
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import orjson
import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts.run import identity
from gym_artifacts.run.artifacts import RunArtifacts
from tests.mlflow_store import mlflow_sqlite
from tests.nemo_gym_runs import write_run

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/io").is_file(), reason="reads are counted by Linux's /proc"
)

PAD = 30_000  # bytes of padding a rollout: the rollouts are nearly all of the run's bytes


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def _padded_run(tmp: Path) -> Path:
    out = write_run(tmp / "run" / "OUT.jsonl", tasks=60, repeats=4, failing_tasks=[3])
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    out.write_bytes(b"".join(orjson.dumps({**r, "padding": "x" * PAD}) + b"\n" for r in rows))
    old = os.stat(out).st_mtime - 120  # outside the identity cache's racy window, rollouts oldest
    for i, p in enumerate(sorted(out.parent.rglob("*"), key=lambda p: p != out)):
        if p.is_file():
            os.utime(p, (old + i, old + i))
    return out


def _section(name: str, dest: Path) -> dict:
    if name == "local":
        return {"enabled": True, "root": str(dest / "local"), "report": "off"}
    if name == "tensorboard":
        # its table shows the first rows only (1,000 of 100,000 by default; 10 of 240 here)
        return {"enabled": True, "logdir": str(dest / "tb"), "table_rows": 10}
    assert name == "mlflow"
    return {"enabled": True, "tracking_uri": mlflow_sqlite(dest / 'mlflow.db'), "experiment_name": "x",
            "artifact_location": (dest / "mlruns").as_uri(), "report": "off"}  # fmt: skip


def _forget(out: Path) -> None:
    """Cold again: no identity cache, no receipt."""
    for p in out.parent.glob(".*gymart*"):
        p.unlink()
    for p in out.parent.glob("*_export_done.json"):
        p.unlink()


SHIPS_THE_FILE = {"local": 1, "mlflow": 1, "tensorboard": 0}


def _shipped_tables(dest: Path) -> int:
    """Bytes of the tables made from the rollouts that a backend ships beside the file (MLflow:
    NeMo Gym's ``rollouts.json``, one document per row: uploading it reads it, not the rollouts)."""
    return sum(p.stat().st_size for p in dest.rglob("rollouts.json"))


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [False, True], ids=["in-process", "worker-processes"])
@pytest.mark.parametrize(
    "backends",
    [
        pytest.param(("local",), id="local"),
        pytest.param(("tensorboard",), id="tensorboard"),
        pytest.param(("mlflow",), id="mlflow"),
        pytest.param(("local", "tensorboard"), id="local+tensorboard"),
    ],
)
def test_a_cold_export_reads_the_rollouts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backends: tuple[str, ...], parallel: bool
) -> None:
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails the run instead of blocking it
    if parallel:  # the identity's worker processes (their reads are counted once they are reaped)
        monkeypatch.setattr(identity, "PARALLEL_MIN_BYTES", 1 << 20)
    out = _padded_run(tmp_path)
    size = out.stat().st_size
    others = sum(p.stat().st_size for p in RunArtifacts.from_path(out).artifact_files().values()) - size
    assert size > 6_000_000 and others < size / 10
    warm = {"exporters": {b: _section(b, tmp_path / "warm") for b in backends}}
    assert all(r.status.value == "EXPORTED" for r in export_run(out, OmegaConf.create(warm)))  # imports
    _forget(out)
    cold = OmegaConf.create({"exporters": {b: _section(b, tmp_path / "cold") for b in backends}})
    before = _rchar()
    results = export_run(out, cold)
    read = _rchar() - before
    faulthandler.cancel_dump_traceback_later()
    assert [r.status.value for r in results] == ["EXPORTED"] * len(backends), [r.reason for r in results]
    shipped = sum(SHIPS_THE_FILE[b] for b in backends)
    tables = _shipped_tables(tmp_path / "cold")
    budget = 1.1 * size + shipped * size + tables + 4 * others + 2_000_000
    assert read <= budget, (
        f"{'+'.join(backends)}: read {read / size:.2f}x the rollouts ({read:,} bytes; budget "
        f"{budget / size:.2f}x: 1.1x + {shipped} shipped + {tables / size:.2f}x of tables + the other files)"
    )


def test_nemo_gym_s_table_is_built_after_the_receipt(tmp_path: Path) -> None:
    """MLflow's copy of NeMo Gym's ``rollouts.json`` table decides nothing of the receipt (the
    run's ``rollouts/rollouts.jsonl`` holds every row): it is built once the receipt is written,
    as the report is, and is in the run when the command returns."""
    from mlflow.tracking import MlflowClient

    from gym_artifacts._builtin_exporters import mlflow as mlflow_module

    out = _padded_run(tmp_path)
    receipt_then: list[bool] = []
    own = mlflow_module.MlflowExporter._upload_nemo_gym_table

    def watched(*args: object, **kwargs: object) -> int:
        receipt_then.append(any(out.parent.glob("*_export_done.json")))
        return own(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mlflow_module.MlflowExporter, "_upload_nemo_gym_table", staticmethod(watched))
        [result] = export_run(out, OmegaConf.create({"exporters": {"mlflow": _section("mlflow", tmp_path)}}))
    assert result.status.value == "EXPORTED", result.reason
    assert any(out.parent.glob("*_export_done.json"))  # the receipt, as the table looked for it
    assert receipt_then == [True]
    client = MlflowClient(tracking_uri=mlflow_sqlite(tmp_path / 'mlflow.db'))
    assert "rollouts.json" in [f.path for f in client.list_artifacts(result.backend_run_id)]


def test_nemo_gym_s_table_comes_from_the_one_read_with_every_line_as_written(tmp_path: Path) -> None:
    """A cold export to MLflow of a run without secrets: NeMo Gym's ``rollouts.json`` holds
    each complete line of the rollouts as written (blank lines skipped, a torn last line left
    out), and the rollouts file is not read again for it."""
    import json

    from mlflow.tracking import MlflowClient

    from gym_artifacts._builtin_exporters import mlflow as mlflow_module

    out = write_run(tmp_path / "run" / "OUT.jsonl", tasks=6, repeats=2, failing_tasks=[3])
    lines = out.read_bytes().splitlines()
    out.write_bytes(b"\n".join([*lines[:3], b"  ", *lines[3:]]) + b"\n" + b'{"torn": ')

    def never(*_: object, **__: object) -> None:
        raise AssertionError("NeMo Gym's table was made from the file")

    config = _section("mlflow", tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mlflow_module, "file_documents", never)
        [result] = export_run(
            out, OmegaConf.create({"exporters": {"mlflow": config}}), accept_partial_line=True
        )
    assert result.status.value == "EXPORTED", result.reason
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    table = json.loads(
        Path(client.download_artifacts(result.backend_run_id, "rollouts.json", str(tmp_path))).read_text()
    )
    assert table == {"columns": ["Rollout"], "data": [[line.decode()] for line in lines]}
