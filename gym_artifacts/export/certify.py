"""The post-run export's policy for a backend that may hold a live run of the same eval.

One place decides, from the run-id marker the live channel left beside the run: certify (let
the backend complete its live run, ``_certify``), or send a new run (``_export_post_run``) and
note on the live run that it was superseded (``_mark_superseded``). The backend only implements
those hooks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gym_artifacts.contract.exporter import CERTIFIED_NOTE
from gym_artifacts.contract.hooks import CannotCertify, ExportPlan, Sent
from gym_artifacts.core.errors import ReceiptError
from gym_artifacts.run.receipts import RunIdMarker, read_marker, write_marker

if TYPE_CHECKING:
    from gym_artifacts.contract.live_exporter import LiveExporter
    from gym_artifacts.run.artifacts import RunArtifacts

logger = logging.getLogger(__name__)


def certify_refusal(marker: RunIdMarker, plan: ExportPlan, destination_key: str) -> str | None:
    """Why the live run of ``marker`` may not be completed by this export (None: it may).

    ``plan.certify`` False never certifies, nor does a run that lives at another destination.
    Otherwise a live run is this run's when either rule holds:

    * completed: the eval ``complete()``d it, its teardown delivered every call (recorded in the
      marker), and the run's files did not change since (``completed_refusal``);
    * content: it ended FINISHED having delivered every call, and the journal and the rollouts it
      logged are the journal and ``OUT.jsonl`` being exported (``content_refusal``), whatever
      was written beside them since (an aggregate written after teardown).
    """
    if plan.certify is False:
        return "--no-certify"
    if marker.destination_key not in (None, destination_key):
        return "it lives at another destination"
    completed = completed_refusal(marker, plan)
    if completed is None:
        return None
    if content_refusal(marker, plan) is None:
        return None
    return completed


def completed_refusal(marker: RunIdMarker, plan: ExportPlan) -> str | None:
    """The ``complete()`` rule: True ``plan.certify`` also accepts a marker from before the loss
    record (``lossless`` unknown), never one that lost calls."""
    if marker.state != "completed":
        return "the eval never called complete()"
    if marker.lossless is False:
        return f"it lost {marker.lost_calls} live call(s): its history is incomplete"
    if marker.lossless is None and plan.certify is not True:
        return "its delivery was not recorded (pass --certify to complete it anyway)"
    if marker.identities != plan.identities:
        return "the run changed since it completed"
    return None


def content_refusal(marker: RunIdMarker, plan: ExportPlan) -> str | None:
    """The content rule: why the files being exported are not what this live run logged."""
    if marker.logged is None or marker.ended != "FINISHED":
        return "its teardown recorded no content to compare"
    if marker.lossless is not True:
        return "it did not deliver every call"
    for name, identity in marker.logged.items():
        if plan.identities.get(name) != identity:
            return f"its {name} differs from the run's"
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
        plan = plan.complete()  # the marker is compared with the run's identities
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
