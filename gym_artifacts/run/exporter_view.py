"""NeMo Gym's exporter view of a result: what its collection hands to ``export_rollouts``.

NeMo Gym 0.7.0 (``rollout_collection._rollout_for_export``) leaves out of what the exporters get,
with ``observability_enabled``, the complete trajectory (``ng_trajectory``) and the raw payloads of
the captured model calls (``ng_model_call_capture.calls[*]``: ``request``, ``response``,
``request_raw``, ``response_raw``); ``OUT.jsonl`` and ``OUT_failures.jsonl`` hold them. So a live
run's rollouts are the files' records seen this way: the export compares what the live run
logged with this view of the run (``export.certify``) when the records themselves differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_artifacts.core.errors import RunError

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts

TRAJECTORY_KEY = "ng_trajectory"
CAPTURE_KEY = "ng_model_call_capture"
CALL_PAYLOAD_KEYS = ("request", "response", "request_raw", "response_raw")


def exporter_view(result: Any) -> Any:
    """``result`` as NeMo Gym hands it to its exporters (a record that is no object: itself)."""
    if not isinstance(result, dict):
        return result
    view = dict(result)
    view.pop(TRAJECTORY_KEY, None)
    view.pop(CAPTURE_KEY, None)
    capture = result.get(CAPTURE_KEY)
    if isinstance(capture, dict):
        captured = dict(capture)
        calls = capture.get("calls")
        if isinstance(calls, list):
            captured["calls"] = [
                {k: v for k, v in call.items() if k not in CALL_PAYLOAD_KEYS}
                for call in calls
                if isinstance(call, dict)
            ]
        else:
            captured.pop("calls", None)
        view[CAPTURE_KEY] = captured
    return view


def exporter_view_identity(run: RunArtifacts) -> str | None:
    """The multiset identity (as ``LoggedRollouts`` computes it live) of the exporter view of every
    result in ``OUT.jsonl`` and NeMo Gym's ``OUT_failures.jsonl``; None when no record holds what
    the view leaves out (the plain identities answer then) or a record cannot be encoded."""
    import orjson

    from gym_artifacts.core.jsonio import canonical_record, iter_jsonl
    from gym_artifacts.run.artifacts import FAILURES
    from gym_artifacts.run.identity import JsonlDigest
    from gym_artifacts.run.torn import partial_last_line

    rollouts = run.rollouts_fpath
    if rollouts is None or not rollouts.is_file():
        return None
    torn = partial_last_line(rollouts)
    files = [(rollouts, torn.complete_bytes if torn else None)]
    failures = run.sidecar_files().get(FAILURES)
    if failures is not None:
        files.append((failures, None))
    digest, narrowed = JsonlDigest(), False
    try:
        for fpath, end in files:
            for lineno, record in iter_jsonl(fpath, "rollouts JSONL", end=end):
                view = exporter_view(record)
                narrowed = narrowed or view != record
                digest.add_record_bytes(canonical_record(orjson.dumps(view), fpath, lineno))
    except (RunError, OSError, TypeError, orjson.JSONEncodeError):
        return None
    return digest.hexdigest() if narrowed else None
