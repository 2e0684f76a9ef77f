"""export_run(): a finished run to every selected backend, exactly once each.

For each backend: a receipt that matches the run's identities means SKIPPED without building
or contacting the backend; a receipt that does not match (or is not ours) means FAILED with
nothing sent; no receipt means send, then publish the receipt atomically. One backend's
failure never stops another's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gym_artifacts.config import (
    enabled_exporters,
    exporter_names,
    exporter_section,
    normalize,
    resolve_tolerant,
    resolve_upload_rollouts,
    validate_settings,
)
from gym_artifacts.errors import ConfigError, GymArtifactsError, ReceiptError, RunError
from gym_artifacts.exporter import ExportPlan, ExportResult, ExportStatus
from gym_artifacts.identity import content_identities, run_identity
from gym_artifacts.locking import LockBusy, exclusive_lock
from gym_artifacts.payload import backend_config, load_run_config
from gym_artifacts.receipts import (
    Receipt,
    identity_differences,
    publish_receipt,
    read_receipt,
    utc_now_iso,
)
from gym_artifacts.registry import discover, get_entry
from gym_artifacts.run import ROLLOUTS, RunArtifacts
from gym_artifacts.secrets import collect_secret_values, install_log_redaction, redact_text, remember_secrets

logger = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = float(os.environ.get("GYM_ARTIFACTS_LOCK_WAIT", "600"))
Signatures = dict[str, tuple[int, int, int]]


def select_exporters(cfg: Any, names: Sequence[str] | None) -> list[str]:
    """The backends to export to: the enabled ones, or exactly ``names`` when given."""
    entries = discover()
    if names:
        selected = list(dict.fromkeys(names))
        for name in selected:
            get_entry(name, entries)
        return selected
    enabled = enabled_exporters(cfg)
    for name in exporter_names(cfg):
        if name in enabled:
            get_entry(name, entries)
    return enabled


def validate_exporter_settings(cfg: Any, names: Sequence[str]) -> None:
    """Refuse invalid backend settings up front (ConfigError naming the key), without building
    any backend. A section that cannot be resolved now (an environment variable that is gone)
    is left to the send, so that an already exported run still skips."""
    entries = discover()
    for name in names:
        cls = get_entry(name, entries).load()
        try:
            section = exporter_section(cfg, name)
        except ConfigError:
            continue
        validate_settings(cls.config_model, section, name)


def file_signatures(run: RunArtifacts) -> Signatures:
    """``{artifact: (size, mtime_ns, inode)}``: any write to the run changes it.

    Not ``identity.stat_key``: that one includes ctime, which a backend's own hard link to a run
    file (the local backend's ``link_or_copy``) changes without changing the content.
    """
    out: Signatures = {}
    for name, fpath in run.artifact_files().items():
        st = fpath.stat()
        out[name] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _changed_message(receipt_fpath: Path, receipt: Receipt, diffs: list[str]) -> str:
    shown = ", ".join(diffs[:5]) + (f" and {len(diffs) - 5} more" if len(diffs) > 5 else "")
    return (
        f"run changed since its export to {receipt.exporter} at {receipt.exported_at} "
        f"(backend run {receipt.backend_run_id}): {shown}; nothing was sent. To export the "
        f"changed run on purpose, delete {receipt_fpath}: it then goes to a new backend run "
        "and the old one is left as it was"
    )


def check_receipt(run: RunArtifacts, name: str, identities: dict[str, str]) -> ExportResult | None:
    """SKIPPED or FAILED when a receipt decides the outcome; None when there is none."""
    fpath = run.export_done_fpath(name)
    try:
        receipt = read_receipt(fpath)
    except ReceiptError as exc:
        return ExportResult(
            name,
            ExportStatus.FAILED,
            reason=f"{exc}; nothing was sent. If it is not needed, delete {fpath} and export again",
        )
    if receipt is None:
        return None
    diffs = identity_differences(receipt.identities, identities)
    if diffs:
        return ExportResult(
            name,
            ExportStatus.FAILED,
            backend_run_id=receipt.backend_run_id,
            reason=_changed_message(fpath, receipt, diffs),
        )
    return ExportResult(name, ExportStatus.SKIPPED, backend_run_id=receipt.backend_run_id)


def _failed(name: str, reason: str, start: float) -> ExportResult:
    return ExportResult(name, ExportStatus.FAILED, reason=reason, seconds=time.monotonic() - start)


def _export_one(
    run: RunArtifacts,
    name: str,
    cfg: Any,
    plan: ExportPlan,
    signatures: Signatures,
) -> ExportResult:
    start = time.monotonic()
    decided = check_receipt(run, name, plan.identities)
    if decided is not None:
        return decided
    try:
        lock = exclusive_lock(run.export_lock_fpath(name), wait_seconds=LOCK_WAIT_SECONDS)
        with lock:
            # Another process may have finished while this one waited.
            decided = check_receipt(run, name, plan.identities)
            if decided is not None:
                return decided
            return _send(run, name, cfg, plan, signatures, start)
    except LockBusy:
        return _failed(name, f"{run.source} is being exported to {name} by another process", start)
    except OSError as exc:
        return _failed(name, f"cannot lock {run.export_lock_fpath(name)}: {exc.strerror}", start)


def _send(
    run: RunArtifacts,
    name: str,
    cfg: Any,
    plan: ExportPlan,
    signatures: Signatures,
    start: float,
) -> ExportResult:
    try:
        entry = get_entry(name)
        if not entry.sdk_installed():
            sdk = entry.load().sdk_module
            return _failed(
                name,
                f"the {name} backend needs the {sdk!r} package, which is not installed: "
                f"pip install 'gym-artifacts[{name}]'",
                start,
            )
        exporter = entry.load().from_global_config(cfg)
    except GymArtifactsError as exc:
        return _failed(name, str(exc), start)
    try:
        result = exporter.export(run, plan)
    except Exception as exc:  # a bug in a backend must not stop the others
        logger.exception("exporter %s crashed", name)
        reason = redact_text(f"internal error: {type(exc).__name__}: {exc}", plan.secrets)
        return _failed(name, reason.splitlines()[0], start)
    if result.status is not ExportStatus.EXPORTED:
        return result
    try:
        if file_signatures(run) != signatures:
            return _failed(
                name,
                f"the run's files changed while it was exported to {name}; no receipt was "
                "written: export again once the run is finished",
                start,
            )
        publish_receipt(
            run.export_done_fpath(name),
            Receipt(
                version=1,
                exporter=name,
                backend_run_id=result.backend_run_id,
                identities=plan.identities,
                exported_at=utc_now_iso(),
                run_identity=plan.run_identity,
                rows=result.rows,
                bytes=result.bytes,
                upload_rollouts=plan.upload_rollouts,
            ),
        )
    except (OSError, RunError) as exc:
        return _failed(name, f"sent, but the receipt could not be written: {exc}", start)
    return result


def export_run(
    run: RunArtifacts | str | os.PathLike[str],
    config: Any,
    exporters: Sequence[str] | None = None,
    upload_rollouts: bool | None = None,
    certify: bool = False,
    on_result: Callable[[ExportResult], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    accept_partial_line: bool = False,
    accept_stale_aggregates: bool = False,
) -> list[ExportResult]:
    """Export one finished run to the selected (else every enabled) backend; a result each.

    ``upload_rollouts`` given explicitly wins over the run's saved setting, which wins over
    ``config``'s. ``accept_partial_line`` sends the complete lines of a rollouts file whose
    last line is torn and records the omission in the backend run; ``accept_stale_aggregates``
    exports aggregate metrics that cannot be tied to the rollouts. Raises ConfigError only for
    an unusable config or exporter name, MissingRunError when nothing of the run exists.
    """
    run = run if isinstance(run, RunArtifacts) else RunArtifacts.from_path(run)
    run.require_present()
    install_log_redaction()
    cfg = normalize(config)
    remember_secrets(collect_secret_values(resolve_tolerant(cfg)))
    names = select_exporters(cfg, exporters)
    start = time.monotonic()

    def finish(results: list[ExportResult]) -> list[ExportResult]:
        if on_result is not None:
            for r in results:
                on_result(r)
        return results

    if not names:
        raise ConfigError("no exporter is enabled: set exporters.<name>.enabled or pass -e NAME")
    logger.info("exporting %s to %s", run.source, ", ".join(names))
    try:
        run_config = load_run_config(run)
        upload = resolve_upload_rollouts(upload_rollouts, run_config, cfg)
    except GymArtifactsError as exc:
        return finish([_failed(n, str(exc), start) for n in names])
    missing = run.missing_for_export(
        rollouts_required=upload,
        accept_partial_line=accept_partial_line,
        accept_stale_aggregates=accept_stale_aggregates,
    )
    if missing is not None:
        return finish([_failed(n, f"not exportable: {missing}", start) for n in names])
    logger.info("hashing the run's files (unchanged files come from the identity cache)")
    try:
        signatures = file_signatures(run)
        record_counts: dict[str, int] = {}
        identities = content_identities(run, progress=progress, record_counts=record_counts)
        config_for_backends, secrets = backend_config(run_config)
    except (GymArtifactsError, OSError) as exc:
        return finish([_failed(n, str(exc), start) for n in names])
    plan = ExportPlan(
        identities=identities,
        run_identity=run_identity(identities),
        upload_rollouts=upload,
        certify=certify,
        config=config_for_backends,
        secrets=secrets,
        rollout_rows=record_counts.get(ROLLOUTS),
        partial_line=run.partial_rollouts_line() if upload else None,
    )
    results = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(f"exporting to {name}", i, len(names))
        logger.info("%s: checking the receipt, then sending what the backend lacks", name)
        result = _export_one(run, name, cfg, plan, signatures)
        logger.info("%s: %s %s", name, result.status.value, result.backend_run_id or result.reason or "")
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
