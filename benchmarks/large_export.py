"""A large post-run export: 100,000 rollouts (~200 MB) to the local backend and to a real MLflow
server, wall time and peak RSS above the process baseline, next to copying the same bytes as
one artifact with the SDK directly and to NeMo Gym's way (every rollout in one in-memory
``log_table`` document)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Row, make_run, run_measured

PRELUDE = """
import time, shutil
from omegaconf import OmegaConf
from gym_artifacts.export import export_run
import gym_artifacts.identity, mlflow, mlflow.tracking
import gym_artifacts._builtin_exporters.local, gym_artifacts._builtin_exporters.mlflow
__base = peak_rss_mb()
"""
EPILOGUE = """
__result['base_rss_mb'] = __base
__result['above_mb'] = peak_rss_mb() - __base
"""


def _timed(setup: str, measured: str) -> dict:
    """Run ``measured`` (after ``setup``) in a fresh process: wall time and RSS above imports."""
    return run_measured(
        PRELUDE
        + setup
        + "t = time.perf_counter()\n"
        + measured
        + "__result['wall'] = time.perf_counter() - t\n"
        + EPILOGUE
    )


def _ours(out: Path, section: dict) -> dict:
    # Each measured export starts cold: no identity cache or receipt left by an earlier one.
    out.with_name(f".{out.stem}.gymart-identities.json").unlink(missing_ok=True)
    for receipt in out.parent.glob(f"{out.stem}_*_export_done.json"):
        receipt.unlink()
    return _timed(
        f"cfg = OmegaConf.create({{'exporters': {section!r}}})\n",
        f"[r] = export_run({str(out)!r}, cfg)\nassert r.status.value == 'EXPORTED', r.reason\n",
    )


def _mlflow_run(uri: str, experiment: str) -> str:
    return (
        f"c = mlflow.tracking.MlflowClient({uri!r})\n"
        f"exp = c.get_experiment_by_name({experiment!r})\n"
        f"run = c.create_run(exp.experiment_id if exp else c.create_experiment({experiment!r}))\n"
    )


def _copy_baseline(out: Path, dest: Path) -> dict:
    return _timed("", f"shutil.copyfile({str(out)!r}, {str(dest)!r})\n")


def _sdk_artifact_baseline(out: Path, uri: str) -> dict:
    return _timed(
        _mlflow_run(uri, "baseline"), f"c.log_artifact(run.info.run_id, {str(out)!r}, 'rollouts')\n"
    )


def _nemo_gym_baseline(out: Path, uri: str) -> dict:
    """NeMo Gym's way: every rollout in memory, sent as one ``log_table`` document."""
    return _timed(
        "import json\n" + _mlflow_run(uri, "nemo"),
        f"rows = [json.loads(line) for line in open({str(out)!r})]\n"
        "def cell(v): return json.dumps(v) if isinstance(v, (dict, list)) else v\n"
        "data = {k: [cell(r.get(k)) for r in rows] for k in rows[0]}\n"
        "c.log_table(run.info.run_id, data=data, artifact_file='rollouts.json')\n",
    )


def run(tiny: bool) -> list[Row]:
    from tests.mlflow_server import MlflowServer, free_port

    size = 2_000_000 if tiny else 200_000_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-large-") as tmp_name:
        tmp = Path(tmp_name)
        out = make_run(tmp / "run", size, 1_000_000)
        n_rows = out.read_bytes().count(b"\n")
        local = _ours(out, {"local": {"enabled": True, "root": str(tmp / "local")}})
        copy = _copy_baseline(out, tmp / "copy.jsonl")
        rows.append(
            Row(
                f"export: {n_rows:,} rollouts to local",
                f"{local['wall']:.2f} s, +{local['above_mb']:.0f} MB",
                f"copy {copy['wall']:.2f} s",
                local["wall"] / copy["wall"],
                "<= 1.5x, <= 150 MB",
                local["wall"] / copy["wall"] <= 1.5 and local["above_mb"] <= 150,
                local["above_mb"] + local["base_rss_mb"],
            )
        )
        server = MlflowServer(tmp / "server", free_port()).start()
        try:
            ours = _ours(
                out, {"mlflow": {"enabled": True, "tracking_uri": server.uri, "experiment_name": "bench"}}
            )
            sdk = _sdk_artifact_baseline(out, server.uri)
            nemo = _nemo_gym_baseline(out, server.uri)
        finally:
            server.stop()
        ratio = ours["wall"] / sdk["wall"]
        rows.append(
            Row(
                f"export: {n_rows:,} rollouts to MLflow server",
                f"{ours['wall']:.2f} s, +{ours['above_mb']:.0f} MB",
                f"SDK one artifact {sdk['wall']:.2f} s",
                ratio,
                "<= 1.5x, <= 150 MB",
                ratio <= 1.5 and ours["above_mb"] <= 150,
                ours["above_mb"] + ours["base_rss_mb"],
            )
        )
        rows.append(
            Row(
                "export: NeMo Gym's log_table way (same run)",
                f"{nemo['wall']:.2f} s, +{nemo['above_mb']:.0f} MB",
                f"ours {ours['wall']:.2f} s, +{ours['above_mb']:.0f} MB",
                nemo["wall"] / ours["wall"],
                "reference",
                None,
                nemo["above_mb"] + nemo["base_rss_mb"],
            )
        )
    return rows
