"""A comparison of runs into one MLflow run (the backend's ``_export_comparison`` hook).

The run (tag ``gym_artifacts.kind=compare``) carries the comparison's identity
(``gym_artifacts.comparison``: looked up before a run is created, so a lost receipt never makes
a second one), the base's and every candidate's content identity (and their own MLflow runs when
they are in the same experiment), the tables (``tables/*.json``, shown as tables by MLflow's UI),
the page, metrics ``<metric>/mean_diff|se|ci_low|...`` and the verdict as the run's note.

The note: MLflow keeps at most 8,000 characters in a tag. A longer note is never cut silently:
the tag holds its beginning and says where the rest is, the whole note is the artifact
``compare_note.md``, and the send's result says so.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from gym_artifacts.plugin import ComparisonPayload, Sent, canonical_json, json_safe

from ._mlflow_client import IDENTITY_KEY, ScopedMlflow
from ._mlflow_mapping import MAX_TAG_VALUE

COMPARISON_TAG = "gym_artifacts.comparison"
COMPLETE_TAG = "gym_artifacts.complete"
NOTE_TAG = "mlflow.note.content"
NOTE_ARTIFACT = "compare_note.md"


def note_tag(note: str) -> tuple[str, bool]:
    """``(the note's tag value, whether the whole note needs the artifact)``: the note itself
    when it fits, else its beginning and a pointer to ``compare_note.md``."""
    if len(note) <= MAX_TAG_VALUE:
        return note, False
    pointer = (
        f"\n\n... {len(note):,} characters in all, past MLflow's {MAX_TAG_VALUE:,}: "
        f"the whole note is the artifact {NOTE_ARTIFACT}"
    )
    return note[: MAX_TAG_VALUE - len(pointer)] + pointer, True


def metric_name(name: str) -> str:
    """MLflow metric names take letters, digits, ``_ - . /`` and spaces: the rest become ``_``."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in name)


def send_comparison(ml: ScopedMlflow, experiment_id: str, comparison: ComparisonPayload) -> Sent:
    """Send ``comparison`` into one run of ``experiment_id`` (see the module doc)."""
    found = ml.find_tagged(experiment_id, COMPARISON_TAG, comparison.identity)
    complete = [r for r in found if r.data.tags.get(COMPLETE_TAG) == "true"]
    if complete:
        run_id = str(complete[0].info.run_id)
        return Sent(run_id, note=f"already in MLflow (run {run_id} holds this comparison)")
    note, split = note_tag(comparison.note)
    tags = {
        "gym_artifacts.kind": "compare",
        COMPARISON_TAG: comparison.identity,
        "gym_artifacts.base_identity": comparison.base_identity,
        "gym_artifacts.candidate_identities": ",".join(comparison.candidate_identities),
        "gym_artifacts.base_run": comparison.base_run,
        "gym_artifacts.candidate_runs": ",".join(comparison.candidate_runs),
        "gym_artifacts.framing": comparison.framing,
        NOTE_TAG: note,
    }
    if comparison.verdict is not None:
        tags["gym_artifacts.verdict"] = comparison.verdict
    roles = [("base", comparison.base_identity), *(("candidate", i) for i in comparison.candidate_identities)]
    for role, identity in roles:  # the runs' own MLflow runs, when they were exported here
        own = ml.find_runs(experiment_id, IDENTITY_KEY, identity)
        if own:
            key = f"gym_artifacts.{role}_mlflow_run"
            tags[key] = ",".join(filter(None, [tags.get(key), str(own[0].info.run_id)]))
    tags = {k: v if len(v) <= MAX_TAG_VALUE else v[: MAX_TAG_VALUE - 3] + "..." for k, v in tags.items()}
    if found:
        run_id = str(found[0].info.run_id)  # an earlier attempt died before completing: finish it
    else:
        run_id = ml.create_run(experiment_id, comparison.name[:250], tags, int(time.time() * 1000))
    ml.log_params(run_id, {k: str(v) for k, v in comparison.settings.items()})
    now = int(time.time() * 1000)
    ml.log_metrics(run_id, [(metric_name(k), float(v), now, 0) for k, v in comparison.metrics.items()])
    sent = 0
    with tempfile.TemporaryDirectory(prefix="gym-artifacts-compare-") as tmp:
        for name, (columns, rows) in comparison.tables.items():
            fpath = Path(tmp) / f"{name}.json"
            fpath.write_bytes(canonical_json(json_safe({"columns": columns, "data": rows})))
            sent += ml.log_artifact(run_id, fpath, "tables")
        copy = Path(tmp) / "compare.html"
        copy.write_bytes(comparison.page.read_bytes())
        sent += ml.log_artifact(run_id, copy, None)
        if split:
            whole = Path(tmp) / NOTE_ARTIFACT
            whole.write_text(comparison.note, encoding="utf-8")
            sent += ml.log_artifact(run_id, whole, None)
    tables: list[dict[str, Any]] = [{"path": f"tables/{n}.json", "type": "table"} for n in comparison.tables]
    tags["mlflow.loggedArtifacts"] = json.dumps(tables)
    ml.set_tags(run_id, tags)
    ml.terminate(run_id, "FINISHED")
    ml.set_tags(run_id, {COMPLETE_TAG: "true"})
    why = (
        f"the note ({len(comparison.note):,} characters) is past MLflow's {MAX_TAG_VALUE:,}: the run's "
        f"note holds its beginning, the whole note is the artifact {NOTE_ARTIFACT}"
        if split
        else None
    )
    return Sent(run_id, rows=sum(len(rows) for _, rows in comparison.tables.values()), bytes=sent, note=why)
