"""A large post-run export: 100,000 rollouts (~200 MB) to the local backend and to a real MLflow
server, wall time and peak RSS above the process baseline, next to copying the same bytes as
one artifact with the SDK directly and to NeMo Gym's way (every rollout in one in-memory
``log_table`` document). Full sizes measure three runs of each, interleaved with its baseline,
and print the median with the range; the local export's report and the MLflow run's (built after
the receipt, off the critical path) are measured on rows of their own."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Row, make_run, median, mlflow_server, run_measured

PRELUDE = """
import time, shutil, os
from omegaconf import OmegaConf
from gym_artifacts import export_run
import gym_artifacts.run.identity
{imports}
__base = peak_rss_mb()
"""
EPILOGUE = """
__result['base_rss_mb'] = __base
__result['above_mb'] = peak_rss_mb() - __base
"""
# What each measured process imports before its clock starts: the backend's module and its SDK
# (a baseline gets the SDK it calls), so that the figures compare the work, not the imports.
IMPORTS = {
    "local": "import gym_artifacts._builtin_exporters.local",
    "mlflow": "import mlflow, mlflow.tracking, gym_artifacts._builtin_exporters.mlflow",
    "tensorboard": "import gym_artifacts._builtin_exporters.tensorboard\n"
    "import tensorboard.compat.proto.event_pb2, tensorboard.summary.writer.record_writer",
}
RUNS = 3  # full sizes: three measurements of each figure


def _timed(setup: str, measured: str, imports: str = "") -> dict:
    """Run ``measured`` (after ``setup``) in a fresh process: wall time and RSS above imports."""
    return run_measured(
        PRELUDE.format(imports=imports)
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
    imports = "\n".join(IMPORTS.get(name, "") for name in section)
    return _timed(
        f"cfg = OmegaConf.create({{'exporters': {section!r}}})\n",
        # 'receipt': when the result was recorded (its receipt written), before the work after it
        f"[r] = export_run({str(out)!r}, cfg, on_result=lambda r: __result.setdefault("
        "'receipt', time.perf_counter() - t))\nassert r.status.value == 'EXPORTED', r.reason\n",
        imports,
    )


def _mlflow_run(uri: str, experiment: str) -> str:
    return (
        f"c = mlflow.tracking.MlflowClient({uri!r})\n"
        f"exp = c.get_experiment_by_name({experiment!r})\n"
        f"run = c.create_run(exp.experiment_id if exp else c.create_experiment({experiment!r}))\n"
    )


def _copy_baseline(out: Path, dest: Path) -> dict:
    """A kernel copy (``shutil.copyfile``: ``sendfile``) made durable as ours is (fsync)."""
    return _timed(
        "",
        f"shutil.copyfile({str(out)!r}, {str(dest)!r})\n"
        f"fd = os.open({str(dest)!r}, os.O_RDONLY); os.fsync(fd); os.close(fd)\n",
    )


def _sdk_artifact_baseline(out: Path, uri: str) -> dict:
    return _timed(
        _mlflow_run(uri, "baseline"),
        f"c.log_artifact(run.info.run_id, {str(out)!r}, 'rollouts')\n",
        IMPORTS["mlflow"],
    )


def _nemo_gym_baseline(out: Path, uri: str) -> dict:
    """NeMo Gym's way: every rollout in memory, sent as one ``log_table`` document."""
    return _timed(
        "import json\n" + _mlflow_run(uri, "nemo"),
        f"rows = [json.loads(line) for line in open({str(out)!r})]\n"
        "def cell(v): return json.dumps(v) if isinstance(v, (dict, list)) else v\n"
        "data = {k: [cell(r.get(k)) for r in rows] for k in rows[0]}\n"
        "c.log_table(run.info.run_id, data=data, artifact_file='rollouts.json')\n",
        IMPORTS["mlflow"],
    )


def _report(out: Path, dest: Path) -> dict:
    """The local backend's report of the run, built as after an export (identity cache warm)."""
    return _timed(
        "from gym_artifacts.report import build_report\n", f"build_report({str(out)!r}, {str(dest)!r})\n"
    )


def _runs(pairs: int, measure: object, baseline: object) -> tuple[list[dict], list[dict]]:
    """``pairs`` measurements of ours and of the baseline, interleaved (drift hits both alike)."""
    ours, base = [], []
    for _ in range(pairs):
        ours.append(measure())  # type: ignore[operator]
        base.append(baseline())  # type: ignore[operator]
    return ours, base


def spread(results: list[dict], key: str = "wall") -> str:
    """``median (min-max)`` seconds of the runs (one run: just its figure)."""
    values = [r[key] for r in results]
    if len(values) == 1:
        return f"{values[0]:.2f} s"
    return f"{median(values):.2f} s ({min(values):.2f}-{max(values):.2f}, {len(values)} runs)"


def _mem(results: list[dict]) -> tuple[float, float]:
    """Largest RSS above the imports, and the peak RSS, over the runs."""
    return max(r["above_mb"] for r in results), max(r["above_mb"] + r["base_rss_mb"] for r in results)


def run(tiny: bool) -> list[Row]:
    size = 2_000_000 if tiny else 200_000_000
    pairs = 1 if tiny else RUNS
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-large-") as tmp_name:
        tmp = Path(tmp_name)
        out = make_run(tmp / "run", size, 1_000_000)
        n_rows = out.read_bytes().count(b"\n")
        section = {"local": {"enabled": True, "root": str(tmp / "local"), "report": "off"}}
        local, copy = _runs(
            pairs, lambda: _ours(out, section), lambda: _copy_baseline(out, tmp / "copy.jsonl")
        )
        ratio = median([r["wall"] for r in local]) / median([c["wall"] for c in copy])
        above, peak = _mem(local)
        rows.append(
            Row(
                f"export: {n_rows:,} rollouts to local (until the receipt)",
                f"{spread(local)}, +{above:.0f} MB",
                f"kernel copy + fsync {spread(copy)}",
                ratio,
                "<= 1.5x, <= 150 MB",
                ratio <= 1.5 and above <= 150,
                peak,
            )
        )
        report = _report(out, tmp / "report.html")
        rows.append(
            Row(
                f"local report of {n_rows:,} rollouts (after the receipt, off the critical path)",
                f"{report['wall']:.2f} s, +{report['above_mb']:.0f} MB",
                f"export {median([r['wall'] for r in local]):.2f} s",
                report["wall"] / median([r["wall"] for r in local]),
                "reference (report: after | background | off)",
                None,
                report["above_mb"] + report["base_rss_mb"],
            )
        )
        with mlflow_server(tmp / "server", tiny) as server:
            attempts = iter(range(pairs))

            def fresh_experiment(report: str = "off") -> dict:
                # each export into its own experiment: a run already there (the previous one's)
                # would be found complete and nothing uploaded. Until the receipt: report off
                # (what ``after`` adds is measured on its own row)
                name = f"bench-{next(attempts)}"
                return {"mlflow": {"enabled": True, "tracking_uri": server.uri, "experiment_name": name,
                                   "report": report}}  # fmt: skip

            ours, sdk = _runs(
                pairs, lambda: _ours(out, fresh_experiment()), lambda: _sdk_artifact_baseline(out, server.uri)
            )
            attempts = iter(range(pairs, 2 * pairs))  # experiments of their own again
            with_report = [_ours(out, fresh_experiment("after")) for _ in range(pairs)]
            nemo = _nemo_gym_baseline(out, server.uri)
        ratio = median([r["receipt"] for r in ours]) / median([r["wall"] for r in sdk])
        above, peak = _mem(ours)
        rows.append(
            Row(
                f"export: {n_rows:,} rollouts to MLflow server (identity included, until the receipt)",
                f"{spread(ours, 'receipt')} (the command, NeMo Gym's table after the receipt "
                f"included: {spread(ours)}), +{above:.0f} MB",
                f"SDK one artifact {spread(sdk)}",
                ratio,
                "<= 2x, <= 150 MB",
                ratio <= 2 and above <= 150,
                peak,
            )
        )
        ours_wall = median([r["wall"] for r in ours])
        report_wall = median([r["wall"] for r in with_report]) - ours_wall
        rows.append(
            Row(
                f"MLflow run's report of {n_rows:,} rollouts (after the receipt, uploaded to the run)",
                f"{report_wall:.2f} s (export with report: after {spread(with_report)})",
                f"export {ours_wall:.2f} s",
                report_wall / ours_wall,
                "reference (report: after | background | off)",
                None,
                max(r["above_mb"] + r["base_rss_mb"] for r in with_report),
            )
        )
        rows.append(
            Row(
                "export: NeMo Gym's log_table way (same run)",
                f"{nemo['wall']:.2f} s, +{nemo['above_mb']:.0f} MB",
                f"ours {ours_wall:.2f} s, +{above:.0f} MB",
                nemo["wall"] / ours_wall,
                "reference",
                None,
                nemo["above_mb"] + nemo["base_rss_mb"],
            )
        )
    return rows
