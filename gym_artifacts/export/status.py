"""Where a run stands with each exporter: one receipt per destination, and its live run.

``verify`` asks each exporter whether every receipted backend run still exists (contacting
the backends); without it nothing is contacted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from gym_artifacts.contract.registry import discover, get_entry
from gym_artifacts.core.config import exporter_section, validate_settings
from gym_artifacts.core.destination import describe
from gym_artifacts.core.errors import GymArtifactsError, ReceiptError
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.coverage import Coverage, coverage_of
from gym_artifacts.run.layout import MARKER_SUFFIX, RECEIPT_SUFFIX
from gym_artifacts.run.receipts import Receipt, RunIdMarker, identity_differences, read_marker, read_receipts
from gym_artifacts.run.torn import PartialLine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunState:
    """Where one run stands: exportable or why not, its identities, and each exporter's state."""

    source: str
    run: RunArtifacts
    missing_for_export: str | None
    partial_line: PartialLine | None
    identities: dict[str, str]
    run_identity: str
    exporters: dict[str, dict[str, Any]]
    coverage: Coverage

    @property
    def has_config(self) -> bool:
        return self.run.has_rollouts_file and self.run.config_fpath.is_file()

    def to_json(self) -> dict[str, Any]:
        """The ``gym-artifacts status --json`` object."""
        from gym_artifacts.run.names import NO_CONFIG

        return {
            "run": self.source,
            "partial_last_line_bytes": self.partial_line.partial_bytes if self.partial_line else None,
            "missing_for_export": self.missing_for_export,
            "coverage": self.coverage.to_json(),
            "config": str(self.run.config_fpath) if self.has_config else None,
            "config_note": None if self.has_config else NO_CONFIG,
            "run_identity": self.run_identity,
            "identities": self.identities,
            "exporters": self.exporters,
        }


def run_status(path: str | os.PathLike[str], *, verify: bool = False) -> RunState:
    """Hash the run and read its receipts and markers (contacts no backend, unless ``verify``:
    then each backend is asked whether each receipted run still exists).

    Raises MissingRunError when nothing of the run exists, another GymArtifactsError when its
    files cannot be read faithfully.
    """
    from gym_artifacts.core.config import require_path_arg
    from gym_artifacts.run.identity import content_identities, run_identity

    path = require_path_arg(path, "run")
    run = RunArtifacts.from_path(path).require_present()
    logger.info("checking what keeps %s from a faithful export", path)
    missing = run.missing_for_export(rollouts_required=True)
    torn = run.partial_rollouts_line()
    logger.info("hashing the run's files")
    record_counts: dict[str, int] = {}
    identities = content_identities(run, record_counts=record_counts)
    coverage = coverage_of(run, record_counts)
    refused = coverage.refusal()
    if refused is not None:
        missing = refused if missing is None else f"{missing}; {refused}"
    verify_config = None
    if verify:  # the run's own settings (credentials), aimed at each receipt's destination
        from gym_artifacts.core.config import build_export_config
        from gym_artifacts.run.run_config import load_run_config

        verify_config, _ = build_export_config(None, load_run_config(run))
    logger.info("reading receipts and live-run markers")
    exporters = exporter_states(run, identities, verify_config=verify_config)
    return RunState(
        os.fspath(path), run, missing, torn, identities, run_identity(identities), exporters, coverage
    )


def _configured(run: RunArtifacts) -> set[str]:
    """The backends the run's export would use without ``-c``: the run's saved exporters, else
    the embedded default's (each with a section, enabled or not)."""
    from gym_artifacts.core.config import build_export_config, exporter_names
    from gym_artifacts.run.run_config import load_run_config

    try:
        saved_config = load_run_config(run)
    except GymArtifactsError:  # an unreadable run config: the default's backends
        saved_config = None
    try:
        return set(exporter_names(build_export_config(None, saved_config)[0]))
    except GymArtifactsError:
        return set()


def _names(run: RunArtifacts) -> list[str]:
    """Every configured exporter (:func:`_configured`) and every one with a receipt or marker
    beside the run; a registered backend that nothing configures is left out."""
    names = _configured(run) & set(discover())
    parent, prefix = run.stem.parent, run.stem.name + "_"
    if parent.is_dir():
        for p in parent.iterdir():
            for suffix in (RECEIPT_SUFFIX, MARKER_SUFFIX):
                if p.name.startswith(prefix) and p.name.endswith(suffix):
                    names.add(p.name[len(prefix) : -len(suffix)])
    return sorted(names)


def _verify(name: str, receipt: Receipt, cfg: Any) -> str:
    """present / missing / unknown / error: ..., asking the exporter built for the receipt."""
    if receipt.backend_run_id is None:
        return "unknown"
    try:
        cls = get_entry(name).load()
        section = exporter_section(cfg, name)
        # Aim at the receipt's destination: its values overlay the configured settings.
        fields = cls.config_model.model_fields
        section.update({k: v for k, v in (receipt.destination or {}).items() if k in fields})
        exporter = cls(validate_settings(cls.config_model, section, name))
        if receipt.destination is not None and exporter.destination_key() != receipt.destination_key:
            return "unknown (the receipt's destination cannot be rebuilt from the settings)"
        exists = exporter.backend_run_exists(receipt.backend_run_id)
    except Exception as exc:  # unreachable backend, missing SDK, unusable settings
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return "unknown" if exists is None else ("present" if exists else "missing")


def receipt_state(receipt: Receipt, identities: dict[str, str]) -> dict[str, Any]:
    """One destination's receipt as status shows it."""
    diffs = identity_differences(receipt.identities, identities)
    return {
        "receipt": "differs" if diffs else "matches",
        "destination": receipt.destination,
        "destination_key": receipt.destination_key,
        "where": describe(receipt.destination),
        "backend_run_id": receipt.backend_run_id,
        "exported_at": receipt.exported_at,
        "certified_live_run": receipt.certified_live_run,
        "differences": diffs,
    }


def live_state(marker: RunIdMarker) -> dict[str, Any]:
    """The live run as status shows it: state, superseded, and whether it may be certified."""
    info: dict[str, Any] = {"run_id": marker.run_id, "state": marker.state}
    if marker.superseded_by:
        info["superseded_by"] = marker.superseded_by
    if marker.lossless is False:
        info["lost_calls"] = marker.lost_calls
        info["note"] = f"lost {marker.lost_calls} call(s): the export completes it from the run's files"
    elif marker.lossless is None and marker.state == "completed":
        info["note"] = "delivery not recorded: the export completes it from the run's files"
    return info


def exporter_states(
    run: RunArtifacts,
    identities: dict[str, str],
    *,
    verify_config: Any | None = None,
) -> dict[str, dict[str, Any]]:
    """Per exporter: ``receipt`` (the newest's state, or none/invalid), ``receipts`` (one per
    destination) and ``live_run``. With ``verify_config`` each receipted run is looked up."""
    states: dict[str, dict[str, Any]] = {}
    for name in _names(run):
        try:
            receipt_fpath = run.export_done_fpath(name)
        except GymArtifactsError:
            continue
        info: dict[str, Any] = {"receipt": "none", "receipts": []}
        try:
            receipts = read_receipts(receipt_fpath)
            rows = [receipt_state(r, identities) for r in receipts]
            if verify_config is not None:
                for row, receipt in zip(rows, receipts, strict=True):
                    row["verified"] = _verify(name, receipt, verify_config)
            if rows:
                newest = max(rows, key=lambda r: r["exported_at"])
                info = {**newest, "receipts": rows}
        except ReceiptError as exc:
            info = {"receipt": "invalid", "error": str(exc), "receipts": []}
        try:
            marker = read_marker(run.run_id_marker_fpath(name))
            if marker is not None:
                info["live_run"] = live_state(marker)
        except ReceiptError as exc:
            info["live_run"] = {"error": str(exc)}
        states[name] = info
    return states


EXPORTS_HEADERS = ["exporter", "destination", "receipt", "backend run", "verified", "live run"]


def exports_table(exporters: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The exports table of ``status`` and the report: headers, then one row per exporter and
    destination, the live run on the exporter's first row."""
    rows = []
    for name, info in exporters.items():
        live = info.get("live_run", {})
        live_text = live.get("run_id", "") + (f" [{live['state']}]" if "state" in live else "")
        if live.get("superseded_by"):
            live_text += f" superseded by {live['superseded_by']}"
        if live.get("note"):
            live_text += f" ({live['note']})"
        entries = info["receipts"] or [info]
        for i, entry in enumerate(entries):
            detail = entry.get("backend_run_id") or entry.get("error") or ""
            if entry.get("differences"):
                detail += " (" + ", ".join(entry["differences"]) + ")"
            rows.append([
                name if i == 0 else "", entry.get("where", "-"), entry["receipt"], detail,
                entry.get("verified", ""), live_text if i == 0 else "",
            ])  # fmt: skip
    return list(EXPORTS_HEADERS), rows
