"""Export receipts and live run-id markers: small JSON files published atomically.

A receipt file ``OUT_<exporter>_export_done.json`` (version 2) holds one receipt per
destination the run was sent to. A version-1 file (before destinations) holds one receipt
whose destination is unknown: it is honoured for the destination the run's own config resolves
to, and rewritten as version 2 (with that destination) on the next write.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_artifacts.core.atomic import atomic_write_json
from gym_artifacts.core.errors import ReceiptError, first_validation_error
from gym_artifacts.core.jsonio import read_json

RECEIPT_VERSION = 2
LEGACY_RECEIPT_VERSION = 1


def utc_now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return dt.datetime.now(dt.timezone.utc).isoformat()


class Receipt(BaseModel):
    """Proof that a run with exactly these identities was sent to one backend destination."""

    model_config = ConfigDict(extra="allow")

    exporter: str
    backend_run_id: str | None
    identities: dict[str, str]
    exported_at: str
    run_identity: str | None = None
    rows: int = 0
    bytes: int = 0
    upload_rollouts: bool | None = None
    certified_live_run: bool = False
    # None only for a receipt read from a version-1 file: written before destinations existed.
    destination: dict[str, Any] | None = None
    destination_key: str | None = None
    version: int = RECEIPT_VERSION


class ReceiptFile(BaseModel):
    """Every destination's receipt of one run and exporter."""

    model_config = ConfigDict(extra="allow")

    version: Literal[2]
    exporter: str
    receipts: list[Receipt]


class RunIdMarker(BaseModel):
    """Which backend run a live run opened, and whether the eval said it completed."""

    model_config = ConfigDict(extra="allow")

    version: Literal[1] = 1
    exporter: str
    run_id: str
    state: Literal["open", "completed"] = "open"
    opened_at: str = Field(default_factory=utc_now_iso)
    completed_at: str | None = None
    identities: dict[str, str] | None = None
    superseded_by: str | None = None
    # Where the live run is (None: a marker from before destinations, taken as the export's).
    destination_key: str | None = None
    # The teardown report: True when every call reached the backend; None when not recorded.
    lossless: bool | None = None
    lost_calls: int = 0
    # What the live run logged, recorded at a FINISHED teardown: the identity of the journal and
    # of the rollouts it sent (``{artifact name: identity or None}``), so that an export can tell
    # from content that the run's files are this live run's (``live_certify``).
    ended: str | None = None
    logged: dict[str, str | None] | None = None
    # The identities of the files an export completed this live run with: an export of other files
    # (the run changed since, its receipt deleted to export it on purpose) makes a new run and
    # leaves the completed one as it was. Cleared when a live process writes into the run again.
    certified: dict[str, str] | None = None


def _first_error(exc: ValidationError) -> str:
    loc, msg, _ = first_validation_error(exc)
    return f"{loc or '(top level)'}: {msg}"


def read_receipts(fpath: Path) -> list[Receipt]:
    """Every receipt in ``fpath`` (empty when there is none); ReceiptError when it is not ours."""
    if not fpath.exists():
        return []
    try:
        data = read_json(fpath, "receipt JSON")
    except Exception as exc:  # RunError or an OS error: either way the file is unusable
        raise ReceiptError(f"{exc}") from exc
    if not isinstance(data, dict):
        raise ReceiptError(f"{fpath}: not a gym-artifacts receipt (expected a JSON object)")
    version = data.get("version")
    try:
        if version == LEGACY_RECEIPT_VERSION:
            return [Receipt.model_validate(data)]
        if version == RECEIPT_VERSION:
            return list(ReceiptFile.model_validate(data).receipts)
    except ValidationError as exc:
        raise ReceiptError(f"{fpath}: invalid receipt: {_first_error(exc)}") from exc
    raise ReceiptError(
        f"{fpath}: receipt version {version!r} is not {LEGACY_RECEIPT_VERSION} or {RECEIPT_VERSION}"
    )


def read_receipt(fpath: Path) -> Receipt | None:
    """The most recent receipt in ``fpath`` (any destination), None when there is none."""
    receipts = read_receipts(fpath)
    return max(receipts, key=lambda r: r.exported_at) if receipts else None


def receipt_for(receipts: list[Receipt], key: str, legacy_key: str | None) -> Receipt | None:
    """The receipt that speaks for destination ``key``.

    A receipt written for it; else a version-1 receipt when the run's own config resolves to
    this destination (``legacy_key``), or when that cannot be told (``legacy_key`` None: a
    receipt is never ignored on a guess, so nothing is sent twice).
    """
    for receipt in receipts:
        if receipt.destination_key == key:
            return receipt
    for receipt in receipts:
        if receipt.destination_key is None and legacy_key in (None, key):
            return receipt
    return None


def publish_receipt(
    fpath: Path,
    receipt: Receipt,
    legacy_destination: tuple[dict[str, Any], str] | None = None,
) -> None:
    """Add ``receipt`` to ``fpath`` (replacing its destination's), upgrading a version-1 file.

    Call with the file's lock held. A version-1 receipt gets ``legacy_destination`` (the run's
    own config's destination and key) when known. Published atomically: a crash leaves the old
    file or the new one, never a part.
    """
    try:
        existing = read_receipts(fpath)
    except ReceiptError:
        existing = []  # the export decided to send despite it (only after the user removed it)
    kept: list[Receipt] = []
    for old in existing:
        if old.destination_key is None and legacy_destination is not None:
            dest, key = legacy_destination
            old = old.model_copy(update={"destination": dest, "destination_key": key, "version": 2})
        if old.destination_key is not None and old.destination_key == receipt.destination_key:
            continue
        kept.append(old)
    document = ReceiptFile(version=RECEIPT_VERSION, exporter=receipt.exporter, receipts=[*kept, receipt])
    atomic_write_json(fpath, document.model_dump(mode="json"))


def identity_differences(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """Human-readable differences between two identity maps, one entry per artifact."""
    diffs: list[str] = []
    for name in sorted(recorded.keys() | current.keys()):
        before, after = recorded.get(name), current.get(name)
        if before == after:
            continue
        if before is None:
            diffs.append(f"{name} was added")
        elif after is None:
            diffs.append(f"{name} was removed")
        else:
            diffs.append(f"{name} changed")
    return diffs


def read_marker(fpath: Path) -> RunIdMarker | None:
    """The marker at ``fpath``, None when absent, ReceiptError when it is not ours."""
    if not fpath.exists():
        return None
    try:
        data: Any = read_json(fpath, "run-id marker JSON")
    except Exception as exc:
        raise ReceiptError(f"{exc}") from exc
    try:
        return RunIdMarker.model_validate(data)
    except ValidationError as exc:
        raise ReceiptError(f"{fpath}: not a gym-artifacts run-id marker: {_first_error(exc)}") from exc


def write_marker(fpath: Path, marker: RunIdMarker) -> None:
    """Publish the marker atomically."""
    atomic_write_json(fpath, marker.model_dump(mode="json"))
