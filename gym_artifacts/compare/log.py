"""``compare --log``: the comparison to every tracker that has a place for it, exactly once.

Like every export: the trackers and their settings come from the export's config
(``build_export_config``), each backend's destination from its own ``destination_for`` hook,
and the send is the backend's own hook (``_export_comparison``, run by
``Exporter.export_comparison`` under its deadline; MLflow and W&B implement it, a backend that
does not is skipped, or refused when named with ``-e``). This module builds what the hook
receives (``ComparisonPayload``: plain data, masked) and keeps the receipts.

Exactly once, with the export's own receipts (``run.receipts``: the same file format, one
receipt per destination, published atomically): the comparison's identity is a hash of the
base's and every candidate's content identity and the test's settings (metrics, alpha, margin,
policy). Its receipts live beside the base run, in ``STEM_comparisons/`` (out of the run's own
receipts: ``status`` lists the run's exports only), one file per comparison and exporter
(``c-<identity>_<exporter>_export_done.json``). A rerun with a receipt for the destination is
SKIPPED without contacting the tracker; sends of one identity to one destination are serialized
by the export's identity lock; MLflow looks the identity up before creating a run, W&B derives
its run id from it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3

from gym_artifacts.compare.comparison import CompareError, Comparison
from gym_artifacts.contract.comparison import ComparisonPayload, Table
from gym_artifacts.contract.hooks import ExportResult, ExportStatus
from gym_artifacts.contract.registry import get_entry
from gym_artifacts.core.config import build_export_config
from gym_artifacts.core.errors import GymArtifactsError, ReceiptError
from gym_artifacts.core.jsonio import canonical_json
from gym_artifacts.core.locking import LockBusy, exclusive_lock
from gym_artifacts.core.secrets import mask_values, redact_text
from gym_artifacts.export.engine import Target, build_target, identity_lock_fpath, select_exporters
from gym_artifacts.run.identity import content_identities, run_identity
from gym_artifacts.run.layout import receipt_name
from gym_artifacts.run.receipts import Receipt, publish_receipt, read_receipts, receipt_for, utc_now_iso
from gym_artifacts.run.run_config import backend_config, load_run_config

logger = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = float(os.environ.get("GYM_ARTIFACTS_LOCK_WAIT", "600"))
TASK_ROWS = 100_000  # per-task rows sent (every candidate's together); all are counted on the page
RECEIPTS_FOLDER_SUFFIX = "_comparisons"


def comparison_identity(comparison: Comparison) -> dict[str, Any]:
    """``{"identity", "base", "candidates", "settings"}``: the runs' identities and the test's."""
    base = run_identity(content_identities(comparison.base.run))
    candidates = [run_identity(content_identities(c.candidate.run)) for c in comparison.candidates]
    settings: dict[str, Any] = {
        "alpha": comparison.alpha,
        "margin": comparison.margin,
        "metrics": [r.metric for r in comparison.candidates[0].results] if comparison.candidates else [],
    }
    if comparison.policy is not None and comparison.today is not None:
        policy = canonical_json(comparison.policy.to_json() | {"source": None})
        settings["policy"] = blake3.blake3(policy).hexdigest()[:16]
        # the waivers in force decide the verdict: one expiring makes another comparison (not the day)
        active = [w.to_json() for w in comparison.policy.waivers if w.active(comparison.today)]
        settings["waivers_in_force"] = blake3.blake3(canonical_json(active)).hexdigest()[:16]
    digest = blake3.blake3(b"comparison-v1\0")
    digest.update(canonical_json({"base": base, "candidates": candidates, "settings": settings}))
    return {
        "identity": "c:" + digest.hexdigest()[:40],
        "base": base,
        "candidates": candidates,
        "settings": settings,
    }


def _scalar(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def results_table(comparison: Comparison) -> Table:
    """One row per candidate and metric: the paired test's figures and the verdict."""
    columns = ["candidate", "metric", "framing", "n_pairs", "mean_diff", "se", "ci_low", "ci_high",
               "ci_level", "p_value", "significant", "minimum_detectable_effect", "note",
               "verdict"]  # fmt: skip
    rows = []
    for c in comparison.candidates:
        for r in c.results:
            d = r.to_json()
            rows.append([c.candidate.name, *(_scalar(d[k]) for k in columns[1:-1]), c.verdict["text"]])
    return columns, rows


def tasks_table(comparison: Comparison, limit: int) -> Table:
    """One row per candidate and task (at most ``limit``): states, values of the primary metric, delta."""
    columns = ["candidate", "task", "base", "candidate_state", "base_value", "candidate_value", "delta",
               "base_failed_rollouts", "candidate_failed_rollouts", "input_differs"]  # fmt: skip
    rows: list[list[Any]] = []
    for c in comparison.candidates:
        for r in c.rows:
            if len(rows) >= limit:
                return columns, rows
            rows.append([c.candidate.name, str(r.key), r.base_state, r.candidate_state, r.base_value,
                         r.candidate_value, r.delta, r.base_failed, r.candidate_failed,
                         r.input_differs])  # fmt: skip
    return columns, rows


def gate_table(comparison: Comparison) -> Table:
    """One row per candidate and policy metric: the gate's verdict, status and reason."""
    columns = ["candidate", "verdict", "metric", "tier", "direction", "margin", "alternative", "status",
               "difference", "ci_low", "ci_high", "n_pairs", "reason"]  # fmt: skip
    rows = [
        [c.candidate.name, c.gate["verdict"], *(_scalar(m[k]) for k in columns[2:])]
        for c in comparison.candidates if c.gate is not None for m in c.gate["metrics"]
    ]  # fmt: skip
    return columns, rows


def _metrics(comparison: Comparison) -> dict[str, float]:
    many = len(comparison.candidates) > 1
    out: dict[str, float] = {}
    for c in comparison.candidates:
        for r in c.results:
            prefix = f"{c.candidate.name}/{r.metric}" if many else r.metric
            for name in ("mean_diff", "se", "ci_low", "ci_high", "p_value", "minimum_detectable_effect"):
                value = getattr(r, name)
                if value is not None:
                    out[f"{prefix}/{name}"] = float(value)
            out[f"{prefix}/n_pairs"] = float(r.n_pairs)
    return out


def payload_of(
    comparison: Comparison, page: Path, ident: dict[str, Any], secrets: frozenset[str]
) -> ComparisonPayload:
    """What every backend's ``_export_comparison`` receives (texts masked once, here)."""
    gate = comparison.gate()
    tables = {
        "compare_results": results_table(comparison),
        "compare_tasks": tasks_table(comparison, TASK_ROWS),
    }
    if gate is not None:
        tables["compare_gate"] = gate_table(comparison)
    note = "\n".join(c.verdict["text"] for c in comparison.candidates)
    if gate is not None:
        note += "\n\n" + "\n".join(
            f"{c.gate['verdict']}: {c.candidate.name}: " + "; ".join(c.gate["reasons"])
            for c in comparison.candidates if c.gate is not None
        )  # fmt: skip
    name = f"compare {comparison.base.name} vs " + ", ".join(c.candidate.name for c in comparison.candidates)
    settings = {k: v if isinstance(v, str | int | float) or v is None else ",".join(map(str, v))
                for k, v in ident["settings"].items()}  # fmt: skip
    return ComparisonPayload(
        identity=ident["identity"], base_identity=ident["base"],
        candidate_identities=tuple(ident["candidates"]), settings=settings, name=name,
        base_run=comparison.base.run.source,
        candidate_runs=tuple(c.candidate.run.source for c in comparison.candidates),
        framing=comparison.framing,
        note=redact_text(note, secrets), verdict=None if gate is None else gate["verdict"],
        tables={k: (cols, mask_values(rows, secrets)) for k, (cols, rows) in tables.items()},
        metrics=_metrics(comparison), page=page, secrets=secrets,
    )  # fmt: skip


def receipts_fpath(comparison: Comparison, identity: str, exporter: str) -> Path:
    """The receipt file of this comparison and exporter (see the module doc)."""
    stem = comparison.base.run.stem
    folder = stem.with_name(stem.name + RECEIPTS_FOLDER_SUFFIX)
    return folder / receipt_name("c-" + identity.split(":")[-1][:24], exporter)


def log_comparison(
    comparison: Comparison,
    page: Path,
    config: Path | str | None = None,
    *,
    exporters: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Log the comparison to each selected (else every enabled) tracker; a result dict each
    (``exporter``, ``status`` EXPORTED / SKIPPED / FAILED, ``backend_run_id``, ``reason``,
    ``identity``, ``seconds``).

    CompareError for a tracker named with ``-e`` that has no place for a comparison.
    """
    saved_config = load_run_config(comparison.base.run)
    cfg, _ = build_export_config(config, saved_config)
    names = select_exporters(cfg, list(exporters) or None)
    targets = {name: build_target(name, cfg, saved_config) for name in names}
    refused = [
        n for n in exporters if targets[n].cls is not None and not targets[n].cls.receives_comparisons()
    ]
    if refused:
        places = [n for n, t in targets.items() if t.cls is not None and t.cls.receives_comparisons()]
        raise CompareError(
            f"{', '.join(refused)}: no place for a comparison "
            f"(--log goes to: {', '.join(places) or 'mlflow, wandb'})"
        )
    ident = comparison_identity(comparison)
    payload = payload_of(comparison, page, ident, backend_config(saved_config)[1])
    results = []
    for name, target in targets.items():
        start = time.monotonic()
        result = _log_one(target, payload, ident, receipts_fpath(comparison, ident["identity"], name))
        results.append({
            "exporter": name, "status": result.status.value, "backend_run_id": result.backend_run_id,
            "reason": result.reason or None, "identity": ident["identity"],
            "seconds": round(time.monotonic() - start, 3),
        })  # fmt: skip
    return results


def _log_one(target: Target, payload: ComparisonPayload, ident: dict[str, Any], fpath: Path) -> ExportResult:
    """One tracker: its receipt decides, else its hook sends and a receipt is published."""
    name = target.name
    if target.cls is not None and not target.cls.receives_comparisons():
        return ExportResult(name, ExportStatus.SKIPPED, reason="has no place for a comparison")
    if target.cls is None or target.key is None or target.destination is None:
        return ExportResult(name, ExportStatus.FAILED, reason=target.error or "no destination")
    try:
        with exclusive_lock(identity_lock_fpath(name, target.key, ident["identity"]), LOCK_WAIT_SECONDS):
            receipt = receipt_for(read_receipts(fpath), target.key, None)
            if receipt is not None:
                return ExportResult(name, ExportStatus.SKIPPED, backend_run_id=receipt.backend_run_id,
                                    reason=f"already logged at {receipt.exported_at}")  # fmt: skip
            if not get_entry(name).sdk_installed():
                return ExportResult(name, ExportStatus.FAILED, reason=(
                    f"the {name} backend needs the {target.cls.sdk_module!r} package, "
                    "which is not installed: "
                    f"pip install 'gym-artifacts[{name}]'"
                ))  # fmt: skip
            result = target.build().export_comparison(payload)
            if result.status is ExportStatus.EXPORTED:
                settings = blake3.blake3(canonical_json(ident["settings"])).hexdigest()[:24]
                identities = {"base": ident["base"], "settings": settings}
                identities.update({f"candidate {i}": c for i, c in enumerate(ident["candidates"], 1)})
                fpath.parent.mkdir(parents=True, exist_ok=True)
                publish_receipt(fpath, Receipt(
                    exporter=name, backend_run_id=result.backend_run_id, identities=identities,
                    exported_at=utc_now_iso(), run_identity=ident["identity"], rows=result.rows,
                    bytes=result.bytes, destination=target.destination, destination_key=target.key,
                ))  # fmt: skip
            return result
    except LockBusy:
        return ExportResult(
            name, ExportStatus.FAILED, reason="another process is logging this comparison there"
        )
    except ReceiptError as exc:
        reason = f"{exc}; nothing was sent. If it is not needed, delete {fpath} and log again"
        return ExportResult(name, ExportStatus.FAILED, reason=reason)
    except (OSError, GymArtifactsError) as exc:
        return ExportResult(name, ExportStatus.FAILED, reason=redact_text(str(exc), payload.secrets))
