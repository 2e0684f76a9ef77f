"""``compare --log``: the comparison to the trackers that have a place for it, exactly once.

Where it goes: an MLflow run (kind ``compare``) tagged with the base's and each candidate's run
identity (the tag the runs' own MLflow exports carry, and their MLflow run ids when they are in
the same experiment), holding the results and per-task tables and the page; a W&B run (job type
``compare``) holding the same two tables. Other trackers have no place for a comparison and are
skipped (refused when named with ``-e``).

Exactly once, like an export: the comparison's identity is a hash of the base's and every
candidate's content identity (``run.identity.run_identity``) and the test's settings (metrics,
alpha, margin). A receipt per identity and destination is kept beside the base run
(``STEM_compare_receipts.json``); a rerun with a receipt is SKIPPED without contacting the
tracker. Sends of one identity to one destination are serialized by the export's identity
lock; MLflow also looks the identity up before creating a run (a lost receipt never makes a
second run), W&B derives the run id from it (a retry resumes the same run).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import blake3

from gym_artifacts.compare.comparison import CompareError, Comparison
from gym_artifacts.core.atomic import atomic_write_json
from gym_artifacts.core.config import build_export_config
from gym_artifacts.core.jsonio import canonical_json, json_safe, read_json
from gym_artifacts.core.locking import LockBusy, exclusive_lock
from gym_artifacts.core.secrets import redact_text
from gym_artifacts.run.identity import content_identities, run_identity
from gym_artifacts.run.receipts import utc_now_iso

logger = logging.getLogger(__name__)

RECEIPTS_SUFFIX = "_compare_receipts.json"
RECEIPTS_VERSION = 1
COMPARISON_TAG = "gym_artifacts.comparison"
COMPLETE_TAG = "gym_artifacts.complete"
LOCK_WAIT_SECONDS = float(os.environ.get("GYM_ARTIFACTS_LOCK_WAIT", "600"))


def comparison_identity(comparison: Comparison) -> dict[str, Any]:
    """``{"identity", "base", "candidates", "settings"}``: the runs' identities and the test's."""
    base = run_identity(content_identities(comparison.base.run))
    candidates = [run_identity(content_identities(c.candidate.run)) for c in comparison.candidates]
    settings = {
        "alpha": comparison.alpha,
        "margin": comparison.margin,
        "metrics": [r.metric for r in comparison.candidates[0].results] if comparison.candidates else [],
    }
    digest = blake3.blake3(b"comparison-v1\0")
    digest.update(canonical_json({"base": base, "candidates": candidates, "settings": settings}))
    return {
        "identity": "c:" + digest.hexdigest()[:40],
        "base": base,
        "candidates": candidates,
        "settings": settings,
    }


def results_table(comparison: Comparison) -> tuple[list[str], list[list[Any]]]:
    """One row per candidate and metric: the paired test's figures."""
    columns = ["candidate", "metric", "framing", "n_pairs", "mean_diff", "se", "ci_low", "ci_high",
               "ci_level", "p_value", "significant", "minimum_detectable_effect", "note",
               "verdict"]  # fmt: skip
    rows = []
    for c in comparison.candidates:
        for r in c.results:
            d = r.to_json()
            rows.append([c.candidate.name, *(d[k] for k in columns[1:-1]), c.verdict["text"]])
    return columns, rows


def tasks_table(comparison: Comparison, limit: int) -> tuple[list[str], list[list[Any]]]:
    """One row per candidate and task (at most ``limit``): states, values of the primary metric, delta."""
    columns = ["candidate", "task", "base", "candidate_state", "base_value", "candidate_value", "delta",
               "base_failed_rollouts", "candidate_failed_rollouts"]  # fmt: skip
    rows: list[list[Any]] = []
    for c in comparison.candidates:
        for r in c.rows:
            if len(rows) >= limit:
                return columns, rows
            rows.append([c.candidate.name, str(r.key), r.base_state, r.candidate_state, r.base_value,
                         r.candidate_value, r.delta, r.base_failed, r.candidate_failed])  # fmt: skip
    return columns, rows


def _split_json(columns: list[str], rows: list[list[Any]]) -> bytes:
    return canonical_json(json_safe({"columns": columns, "data": rows}))


# -- MLflow --------------------------------------------------------------------------------------
def _log_mlflow(settings: Any, comparison: Comparison, ident: dict[str, Any], page: Path) -> tuple[str, str]:
    from gym_artifacts._builtin_exporters._mlflow_client import IDENTITY_KEY, RequestLimits, ScopedMlflow
    from gym_artifacts.core.destination import absolute_store_uri

    s = settings
    token = s.tracking_token.get_secret_value() if s.tracking_token else None
    limits = RequestLimits(
        s.export_request_timeout, s.export_request_retries, backoff=1.0, deadline=s.export_deadline
    )
    ml = ScopedMlflow(absolute_store_uri(s.tracking_uri), token, limits)
    experiment_id = ml.experiment_id(s.experiment_name, s.artifact_location)
    found = ml.find_tagged(experiment_id, COMPARISON_TAG, ident["identity"])
    complete = [r for r in found if r.data.tags.get(COMPLETE_TAG) == "true"]
    if complete:
        run_id = str(complete[0].info.run_id)
        return run_id, f"already in MLflow (run {run_id} holds this comparison)"
    tags = {
        "gym_artifacts.kind": "compare",
        COMPARISON_TAG: ident["identity"],
        "gym_artifacts.base_identity": ident["base"],
        "gym_artifacts.candidate_identities": ",".join(ident["candidates"]),
        "gym_artifacts.base_run": comparison.base.run.source,
        "gym_artifacts.candidate_runs": ",".join(c.candidate.run.source for c in comparison.candidates),
        "gym_artifacts.framing": comparison.framing,
        "mlflow.note.content": "\n".join(c.verdict["text"] for c in comparison.candidates),
    }
    # the runs' own MLflow runs, when they were exported to this experiment
    for role, identity in [("base", ident["base"]), *(("candidate", i) for i in ident["candidates"])]:
        own = ml.find_runs(experiment_id, IDENTITY_KEY, identity)
        if own:
            key = f"gym_artifacts.{role}_mlflow_run"
            tags[key] = ",".join(filter(None, [tags.get(key), str(own[0].info.run_id)]))
    if found:
        run_id = str(found[0].info.run_id)  # an earlier attempt died before completing: finish it
    else:
        name = f"compare {comparison.base.name} vs " + ", ".join(
            c.candidate.name for c in comparison.candidates
        )
        run_id = ml.create_run(experiment_id, name[:250], tags, int(time.time() * 1000))
    ml.log_params(run_id, {"alpha": str(comparison.alpha), "margin": str(comparison.margin),
                           "metrics": ",".join(ident["settings"]["metrics"])})  # fmt: skip
    many = len(comparison.candidates) > 1
    points = []
    now = int(time.time() * 1000)
    for c in comparison.candidates:
        for r in c.results:
            prefix = f"{c.candidate.name}/{r.metric}" if many else r.metric
            for field in ("mean_diff", "se", "ci_low", "ci_high", "p_value", "minimum_detectable_effect"):
                value = getattr(r, field)
                if value is not None:
                    points.append((_metric_name(f"{prefix}/{field}"), float(value), now, 0))
            points.append((_metric_name(f"{prefix}/n_pairs"), float(r.n_pairs), now, 0))
    ml.log_metrics(run_id, points)
    with tempfile.TemporaryDirectory(prefix="gym-artifacts-compare-") as tmp:
        for name, table in (
            ("compare_results", results_table(comparison)),
            ("compare_tasks", tasks_table(comparison, 100_000)),
        ):
            fpath = Path(tmp) / f"{name}.json"
            fpath.write_bytes(_split_json(*table))
            ml.log_artifact(run_id, fpath, "tables")
        copy = Path(tmp) / "compare.html"
        copy.write_bytes(page.read_bytes())
        ml.log_artifact(run_id, copy, None)
    tags["mlflow.loggedArtifacts"] = json.dumps(
        [{"path": f"tables/{n}.json", "type": "table"} for n in ("compare_results", "compare_tasks")]
    )
    ml.set_tags(run_id, tags)
    ml.terminate(run_id, "FINISHED")
    ml.set_tags(run_id, {COMPLETE_TAG: "true"})
    return run_id, ""


def _metric_name(name: str) -> str:
    """MLflow metric names take letters, digits, ``_ - . / `` and spaces: the rest become ``_``."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in name)


# -- W&B -----------------------------------------------------------------------------------------
def _log_wandb(settings: Any, comparison: Comparison, ident: dict[str, Any], page: Path) -> tuple[str, str]:
    import wandb

    s = settings
    options: dict[str, Any] = {"mode": s.mode, "init_timeout": s.init_timeout, "silent": True,
                               "console": "off", "x_disable_stats": True, "reinit": "create_new"}  # fmt: skip
    if s.api_key is not None:
        options["api_key"] = s.api_key.get_secret_value()
    if s.base_url:
        options["base_url"] = s.base_url
    folder = s.dir.expanduser() if s.dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    run_id = "gc" + ident["identity"].split(":")[-1][:30]
    name = f"compare {comparison.base.name} vs " + ", ".join(c.candidate.name for c in comparison.candidates)
    wb = wandb.init(
        project=s.project, entity=s.entity, group=s.group, tags=[*s.tags, "compare"], id=run_id,
        resume="allow", name=name,
        job_type="compare", dir=str(folder) if folder is not None else None,
        config={"base_identity": ident["base"], "candidate_identities": ident["candidates"],
                "comparison": ident["identity"], **ident["settings"]},
        settings=wandb.Settings(**options),
    )  # fmt: skip
    try:
        results = wandb.Table(*_table_args(results_table(comparison)))
        tasks = wandb.Table(*_table_args(tasks_table(comparison, s.table_max_rows)))
        wb.log({"compare/results": results, "compare/tasks": tasks})
        wb.summary.update({"compare/verdict": " | ".join(c.verdict["text"] for c in comparison.candidates)})
    except BaseException:
        wb.finish(exit_code=1)
        raise
    wb.finish(exit_code=0)
    return run_id, ""


def _table_args(table: tuple[list[str], list[list[Any]]]) -> tuple[list[str], list[list[Any]]]:
    columns, rows = table
    return columns, [
        [v if v is None or isinstance(v, int | float | str | bool) else str(v) for v in r] for r in rows
    ]


SENDERS: dict[str, Callable[[Any, Comparison, dict[str, Any], Path], tuple[str, str]]] = {
    "mlflow": _log_mlflow,
    "wandb": _log_wandb,
}


# -- receipts ------------------------------------------------------------------------------------
def receipts_fpath(comparison: Comparison) -> Path:
    stem = comparison.base.run.stem
    return stem.with_name(stem.name + RECEIPTS_SUFFIX)


def _read_receipts(fpath: Path) -> list[dict[str, Any]]:
    if not fpath.is_file():
        return []
    data = read_json(fpath, "compare receipts JSON")
    if (
        not isinstance(data, dict)
        or data.get("version") != RECEIPTS_VERSION
        or not isinstance(data.get("receipts"), list)
    ):
        raise CompareError(f"{fpath}: not a gym-artifacts compare receipts file (remove it to log again)")
    return [r for r in data["receipts"] if isinstance(r, dict)]


def _find_receipt(fpath: Path, exporter: str, key: str, identity: str) -> dict[str, Any] | None:
    for receipt in _read_receipts(fpath):
        if (receipt.get("exporter"), receipt.get("destination_key"), receipt.get("identity")) == (
            exporter,
            key,
            identity,
        ):
            return receipt
    return None


def _publish(fpath: Path, receipt: dict[str, Any]) -> None:
    with exclusive_lock(fpath.with_name(f".{fpath.name}.lock"), LOCK_WAIT_SECONDS):
        kept = [
            r for r in _read_receipts(fpath)
            if (r.get("exporter"), r.get("destination_key"), r.get("identity"))
            != (receipt["exporter"], receipt["destination_key"], receipt["identity"])
        ]  # fmt: skip
        atomic_write_json(fpath, {"version": RECEIPTS_VERSION, "receipts": [*kept, receipt]})


def log_comparison(
    comparison: Comparison,
    page: Path,
    config: Path | str | None = None,
    *,
    exporters: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Log the comparison to each selected (else every enabled) tracker; a result dict each
    (``exporter``, ``status`` EXPORTED / SKIPPED / FAILED, ``backend_run_id``, ``reason``).

    The trackers and their settings come as for an export (``build_export_config``: ``-c FILE``,
    else the base run's saved config, else the embedded default). CompareError for a tracker
    named with ``-e`` that has no place for a comparison.
    """
    from gym_artifacts.export.engine import build_target, identity_lock_fpath, select_exporters
    from gym_artifacts.run.run_config import load_run_config

    cfg, _ = build_export_config(config, load_run_config(comparison.base.run))
    names = select_exporters(cfg, list(exporters) or None)
    unsupported = [n for n in exporters if n not in SENDERS]
    if unsupported:
        raise CompareError(
            f"{', '.join(unsupported)}: no place for a comparison (--log goes to: {', '.join(SENDERS)})"
        )
    ident = comparison_identity(comparison)
    fpath = receipts_fpath(comparison)
    results = []
    for name in names:
        start = time.monotonic()

        def result(
            status: str, run_id: str | None = None, reason: str = "", name: str = name, start: float = start
        ) -> dict[str, Any]:
            return {"exporter": name, "status": status, "backend_run_id": run_id, "reason": reason or None,
                    "identity": ident["identity"], "seconds": round(time.monotonic() - start, 3)}  # fmt: skip

        if name not in SENDERS:
            results.append(result("SKIPPED", reason="has no place for a comparison"))
            continue
        target = build_target(name, cfg, None)
        if target.error is not None or target.key is None:
            results.append(result("FAILED", reason=target.error or "no destination"))
            continue
        try:
            with exclusive_lock(
                identity_lock_fpath(f"compare-{name}", target.key, ident["identity"]), LOCK_WAIT_SECONDS
            ):
                receipt = _find_receipt(fpath, name, target.key, ident["identity"])
                if receipt is not None:
                    results.append(result("SKIPPED", receipt.get("backend_run_id"),
                                          f"already logged at {receipt.get('logged_at')}"))  # fmt: skip
                    continue
                exporter = target.build()
                try:
                    run_id, note = SENDERS[name](target.settings, comparison, ident, page)
                except exporter.expected_errors() as exc:
                    reason = redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0])
                    logger.warning("compare --log to %s failed: %s", name, reason)
                    results.append(result("FAILED", reason=reason))
                    continue
                _publish(fpath, {
                    "exporter": name, "destination": target.destination, "destination_key": target.key,
                    "identity": ident["identity"], "base_identity": ident["base"],
                    "candidate_identities": ident["candidates"], "settings": ident["settings"],
                    "backend_run_id": run_id, "logged_at": utc_now_iso(),
                })  # fmt: skip
                results.append(result("EXPORTED", run_id, note))
        except LockBusy:
            results.append(result("FAILED", reason="another process is logging this comparison there"))
        except (OSError, CompareError) as exc:
            results.append(result("FAILED", reason=str(exc)))
    return results
