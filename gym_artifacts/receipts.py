"""Export receipts (version 1) and live run-id markers: small JSON files published atomically."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_artifacts.atomic import atomic_write_json
from gym_artifacts.errors import ReceiptError, first_validation_error
from gym_artifacts.jsonio import read_json

RECEIPT_VERSION = 1


def utc_now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return dt.datetime.now(dt.timezone.utc).isoformat()


class Receipt(BaseModel):
    """Proof that a run with exactly these identities was sent to one backend."""

    model_config = ConfigDict(extra="allow")

    version: Literal[1]
    exporter: str
    backend_run_id: str | None
    identities: dict[str, str]
    exported_at: str
    run_identity: str | None = None
    rows: int = 0
    bytes: int = 0
    upload_rollouts: bool | None = None


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


def _first_error(exc: ValidationError) -> str:
    loc, msg, _ = first_validation_error(exc)
    return f"{loc or '(top level)'}: {msg}"


def read_receipt(fpath: Path) -> Receipt | None:
    """The receipt at ``fpath``, None when there is none, ReceiptError when it is not ours."""
    if not fpath.exists():
        return None
    try:
        data = read_json(fpath, "receipt JSON")
    except Exception as exc:  # RunError or an OS error: either way the file is unusable
        raise ReceiptError(f"{exc}") from exc
    if not isinstance(data, dict):
        raise ReceiptError(f"{fpath}: not a gym-artifacts receipt (expected a JSON object)")
    if data.get("version") != RECEIPT_VERSION:
        raise ReceiptError(f"{fpath}: receipt version {data.get('version')!r} is not {RECEIPT_VERSION}")
    try:
        return Receipt.model_validate(data)
    except ValidationError as exc:
        raise ReceiptError(f"{fpath}: invalid receipt: {_first_error(exc)}") from exc


def publish_receipt(fpath: Path, receipt: Receipt) -> None:
    """Publish atomically: a crash before this returns leaves no receipt, never a part of one."""
    atomic_write_json(fpath, receipt.model_dump(mode="json"))


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
