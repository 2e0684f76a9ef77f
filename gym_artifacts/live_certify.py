"""The post-run export's policy for a backend that may hold a live run of the same eval.

One place decides, from the run-id marker the live channel left beside the run: certify (let
the backend complete its live run, ``_certify``), or send a new run (``_export_post_run``) and
note on the live run that it was superseded (``_mark_superseded``). The backend only implements
those hooks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gym_artifacts.backend import CannotCertify, ExportPlan, Sent
from gym_artifacts.errors import ReceiptError
from gym_artifacts.exporter import CERTIFIED_NOTE
from gym_artifacts.receipts import RunIdMarker, read_marker, write_marker

if TYPE_CHECKING:
    from gym_artifacts.live_exporter import LiveExporter
    from gym_artifacts.run import RunArtifacts

logger = logging.getLogger(__name__)


def certify_refusal(marker: RunIdMarker, plan: ExportPlan, destination_key: str) -> str | None:
    """Why the live run of ``marker`` may not be completed by this export (None: it may).

    Only a run the eval ``complete()``d, whose teardown delivered every call (recorded in the
    marker), whose files did not change since, and that lives at this destination.
    ``plan.certify`` False never certifies; True also accepts a marker from before the loss
    record (``lossless`` unknown), never one that lost calls.
    """
    if plan.certify is False:
        return "--no-certify"
    if marker.destination_key not in (None, destination_key):
        return "it lives at another destination"
    if marker.state != "completed":
        return "the eval never called complete()"
    if marker.lossless is False:
        return f"it lost {marker.lost_calls} live call(s): its history is incomplete"
    if marker.lossless is None and plan.certify is not True:
        return "its delivery was not recorded (pass --certify to complete it anyway)"
    if marker.identities != plan.identities:
        return "the run changed since it completed"
    return None


def certify_or_export(backend: LiveExporter, run: RunArtifacts, plan: ExportPlan) -> Sent:
    """Complete the backend's live run of ``run`` when the marker allows, else send a new run
    and mark the live one superseded (best effort)."""
    name, key = backend.name, backend.destination_key()
    marker_fpath = run.run_id_marker_fpath(name)
    try:
        marker = read_marker(marker_fpath)
    except ReceiptError as exc:
        logger.warning("%s", exc)
        marker = None
    if marker is not None and marker.destination_key not in (None, key):
        marker = None  # a live run elsewhere: neither certified nor superseded by this export
    if marker is not None:
        refusal = certify_refusal(marker, plan, key)
        if refusal is None:
            try:
                sent = backend._certify(run, plan, marker.run_id)
            except CannotCertify as exc:
                logger.info("%s: live run %s not certified: %s", name, marker.run_id, exc)
            else:
                return Sent(sent.backend_run_id, sent.rows, sent.bytes, CERTIFIED_NOTE)
        else:
            logger.info(
                "%s: live run %s not certified (%s); exporting a new run", name, marker.run_id, refusal
            )
    sent = backend._export(run, plan)  # a new backend run (LiveExporter: ``_export_post_run``)
    if marker is not None and marker.run_id != sent.backend_run_id:
        try:
            backend._mark_superseded(marker.run_id, sent.backend_run_id or "")
            write_marker(marker_fpath, marker.model_copy(update={"superseded_by": sent.backend_run_id}))
        except Exception as exc:  # best effort: never fail an export for a courtesy note
            logger.warning("%s: could not mark live run %s superseded: %s", name, marker.run_id, exc)
    return sent
