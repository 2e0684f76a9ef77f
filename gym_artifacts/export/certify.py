"""The post-run export's policy for a backend that may hold a live run of the same eval.

One place decides, from the run-id marker the live channel left beside the run: complete the
live run (``_certify``: the backend sends what the live run lacks into it and ends it, the one
run of this destination), or send a new run (``_export``) and end the live one, noting
where the complete run is (``_mark_superseded``). The backend only implements those hooks; the
export engine calls ``export_live`` and records the decision as ``ExportResult.certified``.

A live run of this output at this destination is *this run's* unless what it recorded says
otherwise: it is completed (repaired) whether or not every call reached the backend, since the
export sends everything the run's files hold that the live run lacks (the journal's metric
points, the rollouts, the artifacts). Only content the live run recorded that differs from the
files being exported (a rollout it never logged, another journal, files changed since
``complete()``) makes a new run, and ``--no-certify`` always does.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from gym_artifacts.contract.exporter import send_watched
from gym_artifacts.contract.hooks import CannotCertify, ExportPlan, ExportResult, ExportStatus, Sent
from gym_artifacts.contract.run_payload import RunPayload
from gym_artifacts.core.errors import GymArtifactsError, ReceiptError
from gym_artifacts.run.artifacts import FAILURES, ROLLOUTS
from gym_artifacts.run.receipts import RunIdMarker, read_marker, write_marker

if TYPE_CHECKING:
    from pathlib import Path

    from gym_artifacts.contract.live_exporter import LiveExporter
    from gym_artifacts.run.artifacts import RunArtifacts

logger = logging.getLogger(__name__)


def certify_refusal(
    marker: RunIdMarker, plan: ExportPlan, destination_key: str, run: RunArtifacts | None = None
) -> str | None:
    """Why the live run of ``marker`` may not be completed by this export (None: it may).

    ``plan.certify`` False never completes it, nor does a run that lives at another destination.
    Otherwise the live run is this run's unless its records contradict the files: it is when the
    files are as they were at ``complete()``, or are what it logged (``content_refusal``: the
    rollouts and journal it sent, whatever was written beside them since). A live run
    with no record (killed before its teardown, resumed after a crash) is this output's live
    run: it is completed with what the files hold. Lost calls never refuse: the export repairs
    the run. Once an export has completed it, only the same files complete it again (a retry,
    a copy): a run changed since goes to a new run, the completed one left as it was.
    """
    if plan.certify is False:
        return "--no-certify"
    if marker.destination_key not in (None, destination_key):
        return "it lives at another destination"
    if marker.certified is not None:  # an export completed it: with these files, or others
        return None if marker.certified == plan.identities else "an export completed it with other files"
    if marker.identities is not None and marker.identities == plan.identities:
        return None  # completed, and the files are as they were then
    if marker.logged is not None:
        return content_refusal(marker, plan, run)
    if marker.identities is not None:
        return "the run changed since it completed"
    return None


def content_refusal(marker: RunIdMarker, plan: ExportPlan, run: RunArtifacts | None = None) -> str | None:
    """Why the files being exported are not what this live run logged (None: they are).

    The rollouts the live run sent match ``OUT.jsonl``, or ``OUT.jsonl`` and NeMo Gym's
    ``OUT_failures.jsonl`` together: with ``+route_failures_to_sidecar=true`` the eval hands its
    failed rollouts to ``export_rollouts`` too, and writes them aside; or NeMo Gym's exporter view
    of them (``run.exporter_view``: with ``observability_enabled`` it leaves the trajectory and raw
    model-call payloads out of what the exporters get). The failures sidecar is as it was when the
    live run ended (a failure added since is one the live run never saw).
    """
    assert marker.logged is not None
    for name, identity in marker.logged.items():
        if plan.identities.get(name) == identity:
            continue
        if name == ROLLOUTS and run is not None and identity is not None:
            payload = RunPayload.of(run, plan)
            try:
                if identity in (payload.rollouts_with_failures_identity, payload.exporter_view_identity):
                    continue
            except GymArtifactsError as exc:
                return f"its rollouts cannot be compared with the run's: {exc}"
        if name == FAILURES:
            return "the failures sidecar changed since the live run ended"
        return f"its {name} differs from the run's"
    return None


def export_live(backend: LiveExporter, run: RunArtifacts, plan: ExportPlan) -> ExportResult:
    """A live backend's post-run export, under its deadline (``send_watched``): its live run of
    ``run`` completed when the marker allows (``certified``), else a new run."""
    certified = False

    def send() -> Sent:
        nonlocal certified
        sent, certified = certify_or_export(backend, run, plan)
        return sent

    result = send_watched(backend, send, run.source, plan.secrets, "export")
    return replace(result, certified=certified and result.status is ExportStatus.EXPORTED)


def certify_or_export(backend: LiveExporter, run: RunArtifacts, plan: ExportPlan) -> tuple[Sent, bool]:
    """Complete the backend's live run of ``run`` when the marker allows (``(sent, True)``), else
    send a new run and end the live one, noting the new one on it (best effort; ``(sent, False)``)."""
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
        refusal = certify_refusal(marker, plan, key, run)
        if refusal is None:
            try:
                sent = backend._certify(run, plan, marker.run_id)
            except CannotCertify as exc:
                logger.info(
                    "%s: live run %s not completed: %s; exporting a new run", name, marker.run_id, exc
                )
            else:
                _record_certified(marker_fpath, marker, plan)
                return sent, True
        else:
            logger.info(
                "%s: live run %s not completed (%s); exporting a new run", name, marker.run_id, refusal
            )
    sent = backend._export(run, plan)  # a new backend run
    if marker is not None and marker.run_id != sent.backend_run_id:
        try:
            backend._mark_superseded(marker.run_id, sent.backend_run_id or "")
            write_marker(marker_fpath, marker.model_copy(update={"superseded_by": sent.backend_run_id}))
        except Exception as exc:  # best effort: never fail an export for a courtesy note
            logger.warning("%s: could not mark live run %s superseded: %s", name, marker.run_id, exc)
    return sent, False


def _record_certified(marker_fpath: Path, marker: RunIdMarker, plan: ExportPlan) -> None:
    """Note in the marker the identities the live run was completed with (``certify_refusal``:
    other files later go to a new run). Best effort: the run is complete whether or not noted."""
    try:
        write_marker(marker_fpath, marker.model_copy(update={"certified": dict(plan.identities)}))
    except Exception as exc:
        logger.warning("%s: could not note the completed run's identities: %s", marker_fpath, exc)
