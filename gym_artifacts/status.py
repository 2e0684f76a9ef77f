"""Where a run stands with each exporter: its receipt (none, matches, differs, invalid) and live run."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from gym_artifacts.errors import GymArtifactsError, ReceiptError
from gym_artifacts.layout import MARKER_SUFFIX, RECEIPT_SUFFIX
from gym_artifacts.receipts import identity_differences, read_marker, read_receipt
from gym_artifacts.registry import discover
from gym_artifacts.run import RunArtifacts
from gym_artifacts.torn import PartialLine

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

    def to_json(self) -> dict[str, Any]:
        """The ``gym-artifacts status --json`` object."""
        return {
            "run": self.source,
            "partial_last_line_bytes": self.partial_line.partial_bytes if self.partial_line else None,
            "missing_for_export": self.missing_for_export,
            "run_identity": self.run_identity,
            "identities": self.identities,
            "exporters": self.exporters,
        }


def run_status(path: str | os.PathLike[str]) -> RunState:
    """Hash the run and read its receipts and markers (contacts no backend).

    Raises MissingRunError when nothing of the run exists, another GymArtifactsError when its
    files cannot be read faithfully.
    """
    from gym_artifacts.identity import content_identities, run_identity

    run = RunArtifacts.from_path(path).require_present()
    logger.info("checking what keeps %s from a faithful export", path)
    missing = run.missing_for_export(rollouts_required=True)
    torn = run.partial_rollouts_line()
    logger.info("hashing the run's files")
    identities = content_identities(run)
    logger.info("reading receipts and live-run markers")
    exporters = exporter_states(run, identities)
    return RunState(os.fspath(path), run, missing, torn, identities, run_identity(identities), exporters)


def exporter_states(run: RunArtifacts, identities: dict[str, str]) -> dict[str, dict[str, Any]]:
    """For every registered exporter and every one with a receipt or marker beside the run."""
    names = set(discover())
    parent, prefix = run.stem.parent, run.stem.name + "_"
    if parent.is_dir():
        for p in parent.iterdir():
            for suffix in (RECEIPT_SUFFIX, MARKER_SUFFIX):
                if p.name.startswith(prefix) and p.name.endswith(suffix):
                    names.add(p.name[len(prefix) : -len(suffix)])
    states: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        try:
            receipt_fpath = run.export_done_fpath(name)
        except GymArtifactsError:
            continue
        info: dict[str, Any] = {"receipt": "none"}
        try:
            receipt = read_receipt(receipt_fpath)
            if receipt is not None:
                diffs = identity_differences(receipt.identities, identities)
                info = {
                    "receipt": "differs" if diffs else "matches",
                    "backend_run_id": receipt.backend_run_id,
                    "exported_at": receipt.exported_at,
                    "differences": diffs,
                }
        except ReceiptError as exc:
            info = {"receipt": "invalid", "error": str(exc)}
        try:
            marker = read_marker(run.run_id_marker_fpath(name))
            if marker is not None:
                info["live_run"] = {"run_id": marker.run_id, "state": marker.state}
        except ReceiptError as exc:
            info["live_run"] = {"error": str(exc)}
        states[name] = info
    return states
