"""Crash safety: ``gym-artifacts export`` SIGKILLed at many points, then run again: the backend
ends with exactly one run for the identity, every metric point once, every artifact whole, and
exactly one valid receipt. The runtime session killed mid-finalize leaves no half-written
artifact under its final name."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters.mlflow import bookkeeping_of
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.identity import content_identities
from gym_artifacts.run.receipts import read_receipt
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[2]

# Runs a command after wrapping TARGET (module[:Class].attr): on its NTH call it kills the process
# before the call, after it, or during it (a strategy that writes part of the output first).
KILLER = textwrap.dedent(
    """
    import importlib, json, os, signal, sys
    target, nth, when, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    module_name, _, attr_path = target.partition(":")
    owner = importlib.import_module(module_name)
    *owners, attr = attr_path.split(".")
    for part in owners:
        owner = getattr(owner, part)
    real = getattr(owner, attr)
    calls = [0]
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] != nth:
            return real(*args, **kwargs)
        if when == "before":
            die()
        if when == "during-copy":          # snapshot.copy_into(src, dst, ...): half the bytes, then die
            src, dst = args[0], args[1]
            data = src.read()
            dst.write(data[: len(data) // 2]); dst.flush()
            die()
        if when == "during-json":          # atomic_write_json(path, obj): half a temp file, then die
            from gym_artifacts.core.atomic import atomic_writer, dumps_pretty
            data = dumps_pretty(args[1])
            with atomic_writer(args[0]) as fh:
                fh.write(data[: len(data) // 2]); fh.flush()
                die()
        if when == "during-artifact":      # ScopedMlflow.log_artifact(self, run_id, path, dir): torn file, then die
            self, run_id, local, artifact_dir = args[:4]
            root = self.get_run(run_id).info.artifact_uri.removeprefix("file://")
            dest = os.path.join(root, artifact_dir or "", os.path.basename(str(local)))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            data = open(local, "rb").read()
            with open(dest, "wb") as fh:
                fh.write(data[: len(data) // 2])
            die()
        result = real(*args, **kwargs)
        die()
    setattr(owner, attr, wrapper)
    if argv[0] == "cli":
        from gym_artifacts.cli import main
        sys.exit(main(argv[1:]))
    exec(argv[1])
    """
)


def killed(target: str, nth: int, when: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    full_env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    full_env.update(env or {})
    proc = run_bounded([sys.executable, "-c", KILLER, target, str(nth), when, json.dumps(argv)],
                          cwd=REPO, capture_output=True, text=True, timeout=180, env=full_env)  # fmt: skip
    assert proc.returncode == -9, (
        f"not killed at {target}#{nth} {when}: rc={proc.returncode} {proc.stderr[-1500:]}"
    )


LOCAL_POINTS = [
    ("gym_artifacts._builtin_exporters.local:atomic_write_json", 1, "after"),  # the run folder exists, nothing in it
    ("gym_artifacts.core.snapshot:copy_into", 2, "during-copy"),  # mid-rollouts
    ("gym_artifacts.core.snapshot:copy_into", 5, "during-copy"),  # mid-artifact (the recording)
    ("gym_artifacts._builtin_exporters.local:snapshot_copy", 1, "before"),  # config, metrics, aggregate sent; rollouts not
    # copied and hashed, not yet renamed to the identity's folder (the folder holds the send key)
    ("gym_artifacts._builtin_exporters.local:publish_folder", 1, "before"),
    ("gym_artifacts.export.engine:publish_receipt", 1, "before"),
    ("gym_artifacts.export.engine:publish_receipt", 1, "after"),
]
MLFLOW_POINTS = [
    ("gym_artifacts._builtin_exporters._mlflow_client:ScopedMlflow.create_run", 1, "after"),
    ("gym_artifacts._builtin_exporters._mlflow_client:ScopedMlflow.log_metrics", 1, "after"),  # the journal is in
    ("gym_artifacts._builtin_exporters._mlflow_client:ScopedMlflow.log_artifact", 3, "during-artifact"),  # mid-rollouts
    ("gym_artifacts._builtin_exporters._mlflow_client:ScopedMlflow.log_artifact", 6, "during-artifact"),  # mid-artifact
    ("gym_artifacts._builtin_exporters._mlflow_client:ScopedMlflow.terminate", 1, "before"),
    # uploaded, FINISHED, not yet tagged with the content identity (the run holds the send key)
    ("gym_artifacts._builtin_exporters.mlflow:MlflowExporter._complete_run", 1, "before"),
    ("gym_artifacts.export.engine:publish_receipt", 1, "before"),
    ("gym_artifacts.export.engine:publish_receipt", 1, "after"),
]


def check_receipt(run: RunArtifacts, name: str) -> str:
    receipts = list(run.stem.parent.glob(f"{run.name}_*_export_done.json"))
    assert [p.name for p in receipts] == [f"{run.name}_{name}_export_done.json"]
    receipt = read_receipt(receipts[0])
    assert receipt is not None and receipt.identities == content_identities(run)
    assert receipt.backend_run_id
    return receipt.backend_run_id


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "nth", "when"), LOCAL_POINTS, ids=[f"{t.split(':')[1]}#{n}-{w}" for t, n, w in LOCAL_POINTS]
)
def test_local_export_killed_then_rerun(
    quickstart_run: Path, tmp_path: Path, target: str, nth: int, when: str
) -> None:
    store = tmp_path / "store"
    args = ["cli", "export", str(quickstart_run), "-e", "local", f"exporters.local.root={store}"]
    if "copyfileobj" in target:  # copy instead of hard-linking, so there is a copy to interrupt
        args = ["exec", textwrap.dedent(f"""
            import os, sys
            def refuse(*a, **k):
                raise OSError(18, "Invalid cross-device link")
            os.link = refuse
            from gym_artifacts.cli import main
            sys.exit(main({args[1:]!r}))
        """)]  # fmt: skip
    killed(target, nth, when, args)
    rerun_local(quickstart_run, store)


def rerun_local(quickstart_run: Path, store: Path) -> None:
    """Export again in this process; then one run folder holds the run, with one receipt."""
    run = RunArtifacts.from_path(quickstart_run)
    [result] = export_run(
        run, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    )
    assert result.status in (ExportStatus.EXPORTED, ExportStatus.SKIPPED), result.reason
    backend_run = check_receipt(run, "local")
    folders = list((store / "default").iterdir())
    assert [f.name for f in folders] == [backend_run]  # exactly one run
    folder = folders[0]
    assert json.loads((folder / "run.json").read_text())["status"] == "FINISHED"
    assert (folder / "rollouts.jsonl").read_bytes() == quickstart_run.read_bytes()
    for src in run.artifacts_dpath.iterdir():
        assert (folder / "artifacts" / src.name).read_bytes() == src.read_bytes(), src.name
    journal = quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()
    sent = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in sent] == [json.loads(x) for x in journal]  # every point once


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "nth", "when"), MLFLOW_POINTS, ids=[f"{t.split(':')[1]}#{n}-{w}" for t, n, w in MLFLOW_POINTS]
)
def test_mlflow_export_killed_then_rerun(
    quickstart_run: Path, tmp_path: Path, target: str, nth: int, when: str
) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    overrides = [f"exporters.mlflow.tracking_uri={uri}", "exporters.mlflow.experiment_name=crash"]
    killed(
        target,
        nth,
        when,
        ["cli", "export", str(quickstart_run), "-e", "mlflow", *overrides],
        {"MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    rerun_mlflow(quickstart_run, uri, tmp_path)


def rerun_mlflow(quickstart_run: Path, uri: str, tmp_path: Path) -> None:
    """Export again in this process; then one MLflow run holds the run, with one receipt."""
    from mlflow.tracking import MlflowClient

    run = RunArtifacts.from_path(quickstart_run)
    cfg = OmegaConf.create(
        {"exporters": {"mlflow": {"enabled": True, "tracking_uri": uri, "experiment_name": "crash"}}}
    )
    [result] = export_run(run, cfg)
    assert result.status in (ExportStatus.EXPORTED, ExportStatus.SKIPPED), result.reason
    backend_run = check_receipt(run, "mlflow")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("crash")
    runs = client.search_runs([experiment.experiment_id])
    identity = bookkeeping_of(client.get_run(backend_run).data.tags)["identity"]
    assert [r.info.run_id for r in runs if bookkeeping_of(r.data.tags).get("identity") == identity] == [
        backend_run
    ]
    assert len(runs) == 1
    history = client.get_metric_history(backend_run, "train/reward")
    journal = [json.loads(x) for x in quickstart_run.with_name("eval_metrics.jsonl").read_text().splitlines()]
    assert sorted((m.step, m.timestamp) for m in history) == [
        (j["step"], int(j["time"] * 1000)) for j in journal
    ]
    assert client.get_run(backend_run).info.status == "FINISHED"
    dest = tmp_path / "dl"
    rollouts = Path(client.download_artifacts(backend_run, "rollouts/rollouts.jsonl", str(dest / "r")))
    assert rollouts.read_bytes() == quickstart_run.read_bytes()
    for src in run.artifacts_dpath.iterdir():
        got = Path(client.download_artifacts(backend_run, f"runtime/{src.name}", str(dest / src.name)))
        assert got.read_bytes() == src.read_bytes(), src.name


# The identity is hashed while the run is sent, and tagged last: killed between the upload and
# that tag, the backend run holds the run's files but not its identity. The rerun finds it by the
# send key (the files' bytes), whether it hashes again while sending (cache cold) or takes the
# identities from the cache the killed export filled (warm: an export that looked its run up by
# the identity alone would make a second run here), or after a ``touch`` of every file (new stat
# keys, the same bytes: the same send key).
BETWEEN_UPLOAD_AND_TAG = {
    "local": ("gym_artifacts._builtin_exporters.local:publish_folder", 1, "before"),
    "mlflow": ("gym_artifacts._builtin_exporters.mlflow:MlflowExporter._complete_run", 1, "before"),
}


@pytest.mark.parametrize("cache", ["warm", "cold", "touched"])
@pytest.mark.parametrize("backend", ["local", "mlflow"])
def test_killed_between_upload_and_identity_tag_then_rerun(
    quickstart_run: Path, tmp_path: Path, backend: str, cache: str
) -> None:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    old = time.time() - 60  # not "racy" for the identity cache: the killed export fills it
    for fpath in [quickstart_run, *quickstart_run.parent.rglob("*")]:
        if fpath.is_file():
            os.utime(fpath, (old, old))
    run = RunArtifacts.from_path(quickstart_run)
    store, uri = tmp_path / "store", f"sqlite:///{tmp_path / 'm.db'}"
    overrides = {
        "local": [f"exporters.local.root={store}"],
        "mlflow": [f"exporters.mlflow.tracking_uri={uri}", "exporters.mlflow.experiment_name=crash"],
    }[backend]
    killed(*BETWEEN_UPLOAD_AND_TAG[backend], ["cli", "export", str(quickstart_run), "-e", backend, *overrides],
           {"MLFLOW_DISABLE_TELEMETRY": "true"})  # fmt: skip
    # killed while the identity was hashed beside the send: sent whole, found by its bytes only
    if backend == "local":
        [sending] = list((store / "default").iterdir())
        assert sending.name.startswith(".sending-")
        assert (sending / "rollouts.jsonl").read_bytes() == quickstart_run.read_bytes()
    else:
        client = MlflowClient(uri)
        [pending] = client.search_runs([client.get_experiment_by_name("crash").experiment_id])
        assert pending.info.status == "FINISHED"
        assert "bytes_digest" in bookkeeping_of(pending.data.tags)
        assert "identity" not in bookkeeping_of(pending.data.tags)
    assert run.identity_cache_fpath.is_file()  # the killed export's hashing finished and was cached
    if cache == "cold":
        run.identity_cache_fpath.unlink()
    if cache == "touched":
        for fpath in run.artifact_files().values():
            os.utime(fpath)
    if backend == "local":
        rerun_local(quickstart_run, store)
    else:
        rerun_mlflow(quickstart_run, uri, tmp_path)
        [only] = MlflowClient(uri).search_runs([pending.info.experiment_id], run_view_type=ViewType.ALL)
        assert only.info.run_id == pending.info.run_id  # completed, not replaced


SESSION_POINTS = [
    ("gym_artifacts.runtime.session:atomic_write_json", 2, "during-json"),  # session_times.json
    ("gym_artifacts.runtime.session:atomic_write_json", 3, "during-json"),  # metrics_summary.json
    ("gym_artifacts.runtime.session:atomic_write_json", 4, "during-json"),  # manifest.json
    ("gym_artifacts.runtime.recording:_copy_fd", 3, "before"),  # mid-recording
]


@pytest.mark.parametrize(
    ("target", "nth", "when"), SESSION_POINTS, ids=[f"{t.split(':')[1]}#{n}" for t, n, _ in SESSION_POINTS]
)
def test_session_killed_mid_finalize(tmp_path: Path, target: str, nth: int, when: str) -> None:
    from tests.media import write_dash_chunks

    chunks = tmp_path / "chunks"
    write_dash_chunks(chunks, frames=30)
    out = tmp_path / "eval.jsonl"
    code = textwrap.dedent(f"""
        from gym_artifacts.runtime.session import maybe_build_session
        s = maybe_build_session({str(out)!r}, nvml_interval=0.1)
        s.mark_start()
        s.finalize(derived_config={{"a": 1}}, recording_session_dir={str(chunks)!r})
    """)  # fmt: skip
    killed(target, nth, when, ["exec", code], {"EXPERIMENT_ID": "crash"})
    folder = tmp_path / "eval_artifacts"
    for p in folder.iterdir():
        if p.name.startswith("."):
            continue  # a temporary file is never a published artifact
        if p.suffix == ".json":
            json.loads(p.read_text())  # whole JSON under every final name
    assert "manifest.json" not in {p.name for p in folder.iterdir()}
    if "recording" in target:
        assert not (folder / "recording.mp4").exists()
