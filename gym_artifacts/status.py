"""Where a run stands with each exporter: its receipt (none, matches, differs, invalid) and live run."""

from __future__ import annotations

from typing import Any

from gym_artifacts.errors import GymArtifactsError, ReceiptError
from gym_artifacts.layout import MARKER_SUFFIX, RECEIPT_SUFFIX
from gym_artifacts.receipts import identity_differences, read_marker, read_receipt
from gym_artifacts.registry import discover
from gym_artifacts.run import RunArtifacts


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
