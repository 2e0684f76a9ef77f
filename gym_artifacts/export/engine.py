"""export_run(): a finished run to every selected backend, exactly once per destination.

For each backend, its destination is computed from the settings (nothing contacted). A receipt
for that exporter and destination that matches the run's identities means SKIPPED without
contacting the backend (``verify`` asks the backend whether the receipted run still exists and
exports anew when it is gone); a receipt that does not match (or is not ours) means FAILED with
nothing sent; no receipt means send, then add the destination's receipt atomically. Sends of
the same files' bytes (the send key) and of one run identity to one destination are serialized
by identity locks, whatever folder the run is in. A first export to a backend that can
(``Exporter.hashes_while_sending``) computes the identities beside the send instead of before
it (``identity.IdentitiesInFlight``). One backend's failure never stops another's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from gym_artifacts.contract.exporter import Exporter
from gym_artifacts.contract.hooks import ExportPlan, ExportResult, ExportStatus
from gym_artifacts.contract.live_exporter import LiveExporter
from gym_artifacts.contract.registry import ExporterEntry, discover, get_entry
from gym_artifacts.core.config import (
    build_export_config,
    enabled_exporters,
    exporter_names,
    exporter_section,
    normalize,
    resolve_tolerant,
    resolve_upload_rollouts,
    validate_settings,
)
from gym_artifacts.core.destination import Destination, destination_key
from gym_artifacts.core.errors import ConfigError, GymArtifactsError, ReceiptError, RunError
from gym_artifacts.core.locking import LockBusy, exclusive_lock, shared_lock_fpath
from gym_artifacts.core.progress import EXPORTING_PROGRESS, TRACES_PROGRESS, WAITING_PROGRESS
from gym_artifacts.core.secrets import (
    collect_secret_values,
    install_log_redaction,
    redact_text,
    remember_secrets,
)
from gym_artifacts.export.certify import export_live
from gym_artifacts.run.artifacts import ROLLOUTS, RunArtifacts
from gym_artifacts.run.coverage import coverage_of
from gym_artifacts.run.identity import (
    IdentitiesInFlight,
    content_identities,
    identities_cached,
    run_identity,
    send_key,
)
from gym_artifacts.run.nemo_gym_params import load_nemo_gym_run_config
from gym_artifacts.run.receipts import (
    Receipt,
    identity_differences,
    publish_receipt,
    read_receipts,
    receipt_for,
    utc_now_iso,
)
from gym_artifacts.run.rollouts_facts import row_values_of_export, run_params
from gym_artifacts.run.run_config import backend_config, load_run_config, run_config_of_export

logger = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = float(os.environ.get("GYM_ARTIFACTS_LOCK_WAIT", "600"))
Signatures = dict[str, tuple[int, int, int, int]]


def select_exporters(
    cfg: Any, names: Sequence[str] | None, entries: dict[str, ExporterEntry] | None = None
) -> list[str]:
    """The backends to export to: the enabled ones, or exactly ``names`` when given (``entries``:
    a registry scan already made, else one is made)."""
    entries = discover() if entries is None else entries
    if names:
        selected = list(dict.fromkeys(names))
        for name in selected:
            get_entry(name, entries)
        return selected
    unresolvable: list[tuple[str, str]] = []
    enabled = enabled_exporters(cfg, unresolvable)
    # a flag that cannot be resolved: the backend is chosen, and its settings' error is its FAILED
    chosen = set(enabled) | {name for name, _ in unresolvable}
    selected = [name for name in exporter_names(cfg) if name in chosen]
    for name in selected:
        get_entry(name, entries)
    return selected


def check_exporter_setting_names(cfg: Any, source: str) -> None:
    """Refuse a setting no registered backend has, in every section of ``cfg`` (enabled or not),
    without resolving any value: ``exporters: {local: {rooot: x}}`` names ``rooot`` instead of
    leaving the section unused."""
    from gym_artifacts.core.config import normalize, raw_container, unknown_setting

    entries = discover()
    for name, section in (raw_container(normalize(cfg)).get("exporters") or {}).items():
        if name not in entries or not isinstance(section, dict):
            continue  # an unknown backend is refused when chosen; its section is checked by normalize
        model = entries[name].load().config_model
        for key in section:
            if key not in model.model_fields:
                raise ConfigError(f"{source}: {unknown_setting(model, name, key)}")


@dataclass
class Target:
    """One exporter of an export: its class and settings, validated once (the backend is built
    only to send or verify), its destination, and the one a version-1 receipt stands for (the
    run's own config's), worked out only when such a receipt is found."""

    name: str
    cls: type[Exporter] | None = None
    settings: Any = None
    error: str | None = None
    key: str | None = None
    destination: Destination | None = None
    saved_config: Any | None = None
    saw_version_1: bool = False  # check_receipt found a receipt without a destination

    @cached_property
    def legacy(self) -> tuple[Destination, str] | None:
        """The run's own config's destination and key; None when unknown (a version-1 receipt
        is then honoured for any destination)."""
        if self.cls is None:
            return None
        try:
            legacy_cfg, _ = build_export_config(None, self.saved_config)
            legacy = self.cls.destination_for(self.cls.settings_from(legacy_cfg))
        except GymArtifactsError:
            return None
        return legacy, destination_key(legacy)

    @property
    def legacy_key(self) -> str | None:
        return self.legacy[1] if self.legacy is not None else None

    def build(self) -> Exporter:
        assert self.cls is not None
        return self.cls(self.settings)


def build_target(name: str, cfg: Any, saved_config: Any | None = None, *, strict: bool = False) -> Target:
    """The exporter's settings from ``cfg`` (validated here, once) and its destination; nothing
    built or contacted.

    A problem becomes ``target.error`` (a FAILED result when it is sent); ``strict`` raises it
    instead (ConfigError naming the key), except for a section that cannot be resolved now (an
    environment variable that is gone): that is left to the send, where it is FAILED (never
    SKIPPED on the strength of a receipt: without its settings, no destination is known).
    """
    target = Target(name, saved_config=saved_config)
    try:
        target.cls = cls = get_entry(name).load()
    except GymArtifactsError as exc:
        if strict:
            raise
        target.error = str(exc)
        return target
    try:
        section = exporter_section(cfg, name)
    except GymArtifactsError as exc:
        target.error = str(exc)
        return target
    try:
        target.settings = validate_settings(cls.config_model, section, name)
        target.destination = cls.destination_for(target.settings)
        target.key = destination_key(target.destination)
    except GymArtifactsError as exc:
        if strict:
            raise
        target.error = str(exc)
    return target


@dataclass(frozen=True)
class ResolvedExport:
    """What an export of one run decides once, before any file of the run is read: the config,
    the exporters (each with its settings and destination) and the run's own config."""

    cfg: Any
    targets: tuple[Target, ...]
    # The run's own saved config (OUT_config.yaml), never NeMo Gym's config (``--run-config``).
    saved_config: Any | None = None
    # Why the run's config could not be read (each backend then fails with it).
    saved_config_error: str | None = None

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.targets]


# ``resolve_export(saved_config=UNREAD)``: the run's config is read there.
UNREAD: Any = object()


def resolve_export(
    run: RunArtifacts,
    config: Any,
    exporters: Sequence[str] | None = None,
    *,
    saved_config: Any = UNREAD,
    strict: bool = False,
) -> ResolvedExport:
    """Config, selection, settings and destinations of one export, resolved once and passed
    down to ``export_resolved``. ``saved_config``: the run's config when the caller already read
    it; ``strict``: invalid settings raise ConfigError (``build_target``)."""
    cfg = normalize(config)
    remember_secrets(collect_secret_values(resolve_tolerant(cfg)))
    names = select_exporters(cfg, exporters)
    if not names:
        raise ConfigError("no exporter is enabled: set exporters.<name>.enabled or pass -e NAME")
    error = None
    if saved_config is UNREAD:
        try:
            saved_config = load_run_config(run)
        except GymArtifactsError as exc:
            saved_config, error = None, str(exc)
    targets = tuple(build_target(name, cfg, saved_config, strict=strict) for name in names)
    return ResolvedExport(cfg, targets, saved_config, error)


def identity_lock_fpath(name: str, key: str, run_identity: str) -> Path:
    """The lock every export of this run identity (or send key) to this destination takes, from
    any folder."""
    return shared_lock_fpath(name, key, run_identity)


def file_signatures(run: RunArtifacts) -> Signatures:
    """``{artifact: (size, mtime_ns, ctime_ns, inode)}``: any write to the run changes it, a
    same-size rewrite whose modification time was put back included (its ctime moves)."""
    out: Signatures = {}
    for name, fpath in run.artifact_files().items():
        st = fpath.stat()
        out[name] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return out


def _changed_message(receipt_fpath: Path, receipt: Receipt, diffs: list[str]) -> str:
    shown = ", ".join(diffs[:5]) + (f" and {len(diffs) - 5} more" if len(diffs) > 5 else "")
    return (
        f"run changed since its export to {receipt.exporter} at {receipt.exported_at} "
        f"(backend run {receipt.backend_run_id}): {shown}; nothing was sent. To export the "
        f"changed run on purpose, delete {receipt_fpath}: it then goes to a new backend run "
        "and the old one is left as it was"
    )


def check_receipt(run: RunArtifacts, target: Target, identities: dict[str, str]) -> ExportResult | None:
    """SKIPPED or FAILED when a receipt for the target's destination decides; None when none does."""
    name = target.name
    fpath = run.export_done_fpath(name)
    try:
        receipts = read_receipts(fpath)
    except ReceiptError as exc:
        return ExportResult(
            name,
            ExportStatus.FAILED,
            reason=f"{exc}; nothing was sent. If it is not needed, delete {fpath} and export again",
        )
    if target.key is None:  # the settings cannot be resolved: no receipt can say where it went
        reason = f"{target.error or 'destination not resolved'}; nothing was sent"
        return ExportResult(name, ExportStatus.FAILED, reason=reason)
    target.saw_version_1 = any(r.destination_key is None for r in receipts)
    receipt = receipt_for(receipts, target.key, target.legacy_key if target.saw_version_1 else None)
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


def _stat_key(fpath: Path) -> tuple[int, int, int] | None:
    """What tells a file rewritten (an atomic replace gives a new inode), None when absent."""
    try:
        st = fpath.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _receipt_written_since(
    run: RunArtifacts, target: Target, before: tuple[tuple[int, int, int] | None, str]
) -> ExportResult | None:
    """EXPORTED when the target's receipt was published since ``before`` (the receipts file's
    stat key and the time then: a Ctrl-C that landed once the data and its receipt were out,
    before the result was recorded): the receipt is the truth the next export skips on, so the
    result says so too; None otherwise (an older receipt in a file another export rewrote too)."""
    fpath = run.export_done_fpath(target.name)
    stat_before, time_before = before
    if target.key is None or _stat_key(fpath) in (None, stat_before):
        return None
    try:
        receipt = receipt_for(read_receipts(fpath), target.key, target.legacy_key)
    except (ReceiptError, OSError):
        return None
    if receipt is None or _utc(receipt.exported_at) < _utc(time_before):
        return None
    return ExportResult(
        target.name, ExportStatus.EXPORTED, receipt.backend_run_id,
        rows=receipt.rows, bytes=receipt.bytes, certified=receipt.certified_live_run,
    )  # fmt: skip


def _utc(iso: str) -> dt.datetime:
    """An ISO 8601 time as a comparable instant (its text does not sort: ``...:00+00:00`` has no
    fraction); an unreadable one is the earliest."""
    try:
        when = dt.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _logged(result: ExportResult) -> ExportResult:
    """The result, its line logged (the line that follows every backend's result)."""
    said = result.backend_run_id or result.reason or ""
    logger.info("%s: %s %s", result.exporter, result.status.value, said)
    return result


def _failed(name: str, reason: str, start: float) -> ExportResult:
    seconds = time.monotonic() - start
    return ExportResult(name, ExportStatus.FAILED, reason=redact_text(reason), seconds=seconds)


def _redacted(result: ExportResult, secrets: frozenset[str] | set[str]) -> ExportResult:
    """Every reason passes the same masking (URI credentials, secret shapes, the known secrets),
    whoever wrote it: a backend's SDK quotes its tracking URI, token included, in its errors."""
    if not result.reason:
        return result
    reason = redact_text(result.reason, secrets)
    return result if reason == result.reason else replace(result, reason=reason)


def _verified(target: Target, decided: ExportResult, start: float) -> ExportResult | None:
    """``--verify`` of a SKIPPED result: kept when the backend run exists, None when it is gone."""
    if decided.status is not ExportStatus.SKIPPED or target.cls is None or not decided.backend_run_id:
        return decided
    try:
        exists = target.build().backend_run_exists(decided.backend_run_id)
    except Exception as exc:  # unreachable backend or refusal: report, never re-send blind
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        reason = f"cannot verify backend run {decided.backend_run_id}: {type(exc).__name__}: {first_line}"
        return _failed(target.name, reason, start)
    if exists is None:
        return replace(decided, reason=f"{target.name} cannot verify its runs; receipt trusted")
    if exists:
        return replace(decided, reason="verified: the backend run exists")
    logger.warning("%s: backend run %s is missing; exporting anew", target.name, decided.backend_run_id)
    return None


def _identities_for(run: RunArtifacts, target: Target, plan: ExportPlan) -> ExportPlan:
    """``plan`` with its identities when this target needs them before sending: a backend that
    does not hash while sending, or a receipt to compare them with (another process's, written
    since the export began). Otherwise ``plan`` as it is (its identities maybe still hashing)."""
    if not plan.identities_pending:
        return plan
    if getattr(target.cls, "hashes_while_sending", False) and not run.export_done_fpath(target.name).exists():
        return plan
    return plan.complete()


def _hash_while_sending(run: RunArtifacts, resolved: ResolvedExport, known: Any) -> bool:
    """Whether this export hashes the run's identities beside the send instead of before it:
    some file is not in the identity cache, a selected backend can (``hashes_while_sending``),
    and nothing is decided from the identities before a send (no receipt or live-run marker of
    a selected backend: SKIPPED, changed and certify are)."""
    if not any(getattr(t.cls, "hashes_while_sending", False) for t in resolved.targets):
        return False
    for target in resolved.targets:
        if run.export_done_fpath(target.name).exists() or run.run_id_marker_fpath(target.name).exists():
            return False
    return not identities_cached(run, known)


def _traces_progress(progress: Callable[[str, int, int], None], name: str) -> Callable[[int, int], None]:
    """A backend's ``(sent, total)`` traces as the export's progress line."""
    return lambda sent, total: progress(f"{TRACES_PROGRESS}{name}", sent, total)


@dataclass
class LockWaitLine:
    """The progress line while an export waits for another export's lock (``on_wait`` of
    ``exclusive_lock``): the holder and the seconds waited; then the export's own line again."""

    progress: Callable[[str, int, int], None]
    name: str
    step: tuple[int, int]  # the export's own line: exporter i of n
    waited: bool = False

    def __call__(self, seconds: float, holder: str) -> None:
        self.waited = True
        self.progress(f"{WAITING_PROGRESS}{self.name} ({holder})", int(seconds), int(LOCK_WAIT_SECONDS))

    def done(self) -> None:
        if self.waited:
            self.progress(f"{EXPORTING_PROGRESS}{self.name}", *self.step)


def _export_one(
    run: RunArtifacts,
    target: Target,
    plan: ExportPlan,
    signatures: Signatures,
    verify: bool,
    after_receipt: list[Callable[[], None]] | None = None,
    waiting: LockWaitLine | None = None,
) -> ExportResult:
    start = time.monotonic()
    name = target.name
    try:
        plan = _identities_for(run, target, plan)
    except (GymArtifactsError, OSError) as exc:
        return _failed(name, str(exc), start)
    decided = check_receipt(run, target, plan.identities)
    if decided is not None and verify:
        decided = _verified(target, decided, start)
    if decided is not None:
        return decided
    if target.cls is None or target.key is None:
        return _failed(name, target.error or "exporter could not be built", start)
    path_lock = run.export_lock_fpath(name)
    wait = partial(exclusive_lock, wait_seconds=LOCK_WAIT_SECONDS, on_wait=waiting)
    try:
        with contextlib.ExitStack() as locks:
            locks.enter_context(wait(path_lock))
            # The same bytes (from any folder), then the same identity when it is known yet.
            for lock_key in dict.fromkeys(k for k in (plan.send_key, plan.run_identity) if k):
                locks.enter_context(wait(identity_lock_fpath(name, target.key, lock_key)))
            if waiting is not None:
                waiting.done()
            # Another process may have finished while this one waited.
            if not verify:
                plan = _identities_for(run, target, plan)
                decided = check_receipt(run, target, plan.identities)
                if decided is not None:
                    return decided
            return _send(run, target, plan, signatures, start, after_receipt)
    except LockBusy as exc:
        return _failed(name, f"{run.source} is being exported to {name} by another process ({exc})", start)
    except GymArtifactsError as exc:  # the identities hashed beside the send could not be
        return _failed(name, str(exc), start)
    except OSError as exc:
        return _failed(name, f"cannot lock {path_lock}: {exc.strerror}", start)


def _send(
    run: RunArtifacts,
    target: Target,
    plan: ExportPlan,
    signatures: Signatures,
    start: float,
    after_receipt: list[Callable[[], None]] | None = None,
) -> ExportResult:
    """Send, then publish the receipt. The work after the receipt (``_after_receipt``) runs here,
    or, given ``after_receipt``, is appended to it for the caller to run once it has recorded the
    result and released the locks."""
    name = target.name
    assert target.cls is not None and target.key is not None and target.destination is not None
    if not get_entry(name).sdk_installed():
        return _failed(
            name,
            f"the {name} backend needs the {target.cls.sdk_module!r} package, which is not installed: "
            f"pip install 'gym-artifacts[{name}]'",
            start,
        )
    try:
        exporter = target.build()
    except GymArtifactsError as exc:
        return _failed(name, str(exc), start)
    try:
        # Certify is decided here, not by the backend: a live backend's live run of this eval may
        # be completed instead of sending a new one (``export.certify``).
        live = isinstance(exporter, LiveExporter)
        result = export_live(exporter, run, plan) if live else exporter.export(run, plan)
    except Exception as exc:  # a bug in a backend must not stop the others
        logger.exception("exporter %s crashed", name)
        reason = redact_text(f"internal error: {type(exc).__name__}: {exc}", plan.secrets)
        return _failed(name, reason.splitlines()[0], start)
    if result.status is not ExportStatus.EXPORTED:
        return result
    try:
        plan = plan.complete()  # a backend that hashed while sending has waited for them already
    except (GymArtifactsError, OSError) as exc:
        return _failed(name, f"sent, but the run's identity could not be computed: {exc}", start)
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
                exporter=name,
                backend_run_id=result.backend_run_id,
                identities=plan.identities,
                exported_at=utc_now_iso(),
                run_identity=plan.run_identity,
                rows=result.rows,
                bytes=result.bytes,
                upload_rollouts=plan.upload_rollouts,
                certified_live_run=result.certified,
                destination=target.destination,
                destination_key=target.key,
            ),
            legacy_destination=target.legacy if target.saw_version_1 else None,
        )
    except (OSError, RunError) as exc:
        return _failed(name, f"sent, but the receipt could not be written: {exc}", start)

    def follow_up() -> None:  # the data and its receipt are published: nothing here can fail it
        try:
            exporter._after_receipt(run, plan, result.backend_run_id)
        except Exception as exc:
            logger.warning("%s: exported; the work after the receipt failed: %s", name, exc)

    if after_receipt is None:
        follow_up()
    else:  # run by the caller once the result is recorded (a Ctrl-C there keeps the result)
        after_receipt.append(follow_up)
    return result


def export_run(
    run: RunArtifacts | str | os.PathLike[str],
    config: Any,
    exporters: Sequence[str] | None = None,
    upload_rollouts: bool | None = None,
    certify: bool | None = None,
    on_result: Callable[[ExportResult], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    accept_partial_line: bool = False,
    accept_stale_aggregates: bool = False,
    verify: bool = False,
    nemo_gym_config: str | os.PathLike[str] | None = None,
) -> list[ExportResult]:
    """Export one finished run to the selected (else every enabled) backend; a result each.

    ``upload_rollouts`` given explicitly wins over ``config``'s, which wins over the run's saved
    setting (``build_export_config`` puts every layer's setting into ``config`` in order; see
    its docstring for the one precedence rule). ``accept_partial_line`` sends the complete
    lines of a rollouts file whose last line is torn and records the omission in the backend
    run; ``accept_stale_aggregates`` exports aggregate metrics that cannot be tied to the
    rollouts. ``certify``: None (or True) completes the live run of this output, sending what
    it lacks, unless what it recorded differs from the files; False never does (a new run). ``verify``
    asks the backend whether a receipted run still exists (re-exporting when it is gone).
    ``nemo_gym_config``: NeMo Gym's resolved global config file, logged (masked, whole) as the run's
    params; without it a run with no saved config logs what its files tell (agent, environment
    server, model, repeats; ``nemo_gym_params``).
    Raises ConfigError only for an unusable config or exporter name, MissingRunError when
    nothing of the run exists.
    """
    run = run if isinstance(run, RunArtifacts) else RunArtifacts.from_path(run)
    run.require_present()
    install_log_redaction()
    options = ExportOptions(
        upload_rollouts, certify, accept_partial_line, accept_stale_aggregates, verify, nemo_gym_config
    )
    return export_resolved(
        run, resolve_export(run, config, exporters), options, on_result=on_result, progress=progress
    )


@dataclass(frozen=True)
class ExportOptions:
    """How one export treats its run, as ``export_run`` documents each option; one value passed
    from the caller (the API, a job of ``export_runs``) down to the send."""

    upload_rollouts: bool | None = None
    certify: bool | None = None
    accept_partial_line: bool = False
    accept_stale_aggregates: bool = False
    verify: bool = False
    nemo_gym_config: str | os.PathLike[str] | None = None


def export_resolved(
    run: RunArtifacts,
    resolved: ResolvedExport,
    options: ExportOptions = ExportOptions(),
    *,
    on_result: Callable[[ExportResult], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[ExportResult]:
    """``export_run`` once its config, exporters, settings and run config are resolved
    (``resolve_export``): nothing of these is read or validated again here."""
    install_log_redaction()
    cfg, names, saved_config = resolved.cfg, resolved.names, resolved.saved_config
    start = time.monotonic()

    def finish(results: list[ExportResult]) -> list[ExportResult]:
        if on_result is not None:
            for r in results:
                on_result(r)
        return results

    logger.info("exporting %s to %s", run.source, ", ".join(names))
    try:
        if resolved.saved_config_error is not None:
            raise RunError(resolved.saved_config_error)
        upload = resolve_upload_rollouts(options.upload_rollouts, cfg, saved_config)
    except GymArtifactsError as exc:
        return finish([_failed(n, str(exc), start) for n in names])
    missing = run.missing_for_export(
        rollouts_required=upload,
        accept_partial_line=options.accept_partial_line,
        accept_stale_aggregates=options.accept_stale_aggregates,
    )
    if missing is not None:
        return finish([_failed(n, f"not exportable: {missing}", start) for n in names])
    logger.info("hashing the run's files (unchanged files come from the identity cache)")
    torn = run.partial_rollouts_line()
    partial_line = torn if upload else None
    hashing: IdentitiesInFlight | None = None
    try:
        signatures = file_signatures(run)
        line_counts: dict[str, int] = {}
        row_values = any(getattr(t.cls, "reads_row_values", False) for t in resolved.targets)
        config_for_backends, secrets = backend_config(saved_config)
        if options.nemo_gym_config is not None:
            config_for_backends, given = load_nemo_gym_run_config(options.nemo_gym_config)
            secrets = secrets | given
        # NeMo Gym's rollouts table from the same read, for a backend that ships it (as written:
        # a run with secrets gets it masked from the file)
        ships_table = any(getattr(t.cls, "ships_rollouts_table", False) for t in resolved.targets)
        table = upload and not secrets and ships_table
        key, known = send_key(run, line_counts, row_values, table)
        record_counts: dict[str, int] = {}
        if torn is None and _hash_while_sending(run, resolved, known):
            logger.info("hashing the run's content identity while sending it")
            hashing = IdentitiesInFlight(run, known)
            identities, identity = {}, ""
            record_counts = line_counts  # no torn rollouts line: its lines are its records
        else:
            identities = content_identities(run, progress=progress, record_counts=record_counts, known=known)
            identity = run_identity(identities)
        coverage = coverage_of(run, record_counts)
    except (GymArtifactsError, OSError) as exc:
        return finish([_failed(n, str(exc), start) for n in names])
    refused = coverage.refusal()
    if refused is not None:
        return finish([_failed(n, f"not exportable: {refused}", start) for n in names])
    plan = ExportPlan(
        identities=identities,
        run_identity=identity,
        upload_rollouts=upload,
        certify=options.certify,
        config=config_for_backends,
        secrets=secrets,
        # counted by the identity pass, or by the send key's read when hashing while sending
        rollout_rows=record_counts.get(ROLLOUTS),
        partial_line=partial_line,
        coverage=coverage,
        send_key=key,
        identities_later=hashing.result if hashing is not None else None,
        files_unchanged=lambda: file_signatures(run) == signatures,
    )
    # A run that saved no config gets the params its rollouts tell (``run_params``: from the
    # send key's one read of them when it was made, else a full read), asked only once a backend
    # is about to send (a SKIP answers from stat calls, the identity cache and the receipt).
    reads_params = options.nemo_gym_config is None and not config_for_backends
    results = []
    # a backend asking for the run config gets this one, not a re-read; the rows' values the one
    # read of the rollouts spooled for a backend are let go at the end
    with run_config_of_export(run, saved_config), row_values_of_export(run):
        for i, target in enumerate(resolved.targets):
            name = target.name
            if progress is not None:
                progress(f"{EXPORTING_PROGRESS}{name}", i, len(names))
            logger.info("%s: checking the receipt, then sending what the backend lacks", name)
            after_receipt: list[Callable[[], None]] = []
            # a receipt decided without --verify: what _export_one would answer first (an export
            # that hashes while sending found no receipt before it started; _export_one decides one
            # that appears meanwhile, once the identities are known)
            decides_first = reads_params and not options.verify and hashing is None
            result = check_receipt(run, target, identities) if decides_first else None
            if reads_params and result is None:
                try:  # a send may follow: only now are the rollouts read for the run's params
                    plan, reads_params = replace(plan, config=run_params(run) or plan.config), False
                except OSError as exc:
                    result = _failed(name, f"cannot read {run.rollouts_fpath}: {exc}", start)
            if result is None:
                sending, waiting = plan, None  # with the progress lines of its traces and lock waits
                if progress is not None:
                    sending = replace(plan, on_traces_sent=_traces_progress(progress, name))
                    waiting = LockWaitLine(progress, name, (i, len(names)))
                receipt_before = _stat_key(run.export_done_fpath(name)), utc_now_iso()
                try:
                    verify = options.verify
                    sent = _export_one(run, target, sending, signatures, verify, after_receipt, waiting)
                    result = _logged(_redacted(sent, secrets))
                except KeyboardInterrupt:  # the receipt may be written: then the backend finished
                    landed = _receipt_written_since(run, target, receipt_before)
                    if landed is not None:
                        results.append(landed)
                        if on_result is not None:
                            on_result(landed)
                    raise
            else:
                result = _logged(_redacted(result, secrets))
            results.append(result)
            if on_result is not None:
                on_result(result)
            for follow_up in after_receipt:  # e.g. the local report, once the result is recorded
                follow_up()
    return results
