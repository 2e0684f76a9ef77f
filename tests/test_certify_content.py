"""The content rule that ties a live run to the files an export finds (``export.certify``).

NeMo Gym 0.7.0 with ``+route_failures_to_sidecar=true`` hands every result to
``export_rollouts`` (in completion order, in batches of any size) and writes each to
``OUT.jsonl`` or, failed, to ``OUT_failures.jsonl``. Whatever the split, the order and the
batches, the live run's recorded rollouts are the run's; one row more or less (in either file),
or a changed row, is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_artifacts.contract.hooks import ExportPlan
from gym_artifacts.export.certify import certify_refusal
from gym_artifacts.live.content import LoggedRollouts
from gym_artifacts.run.artifacts import METRICS_JOURNAL, ROLLOUTS, RunArtifacts
from gym_artifacts.run.identity import content_identities
from gym_artifacts.run.receipts import RunIdMarker

pytestmark = pytest.mark.slow

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
rows = st.lists(st.dictionaries(st.text(max_size=6), values, max_size=4), min_size=1, max_size=12)


def write(fpath: Path, records: list[dict[str, Any]]) -> None:
    fpath.write_text("".join(json.dumps(r) + "\n" for r in records))


def refusal_after(
    tmp: Path, logged: list[dict[str, Any]], ok: list[dict[str, Any]], failed: list[dict[str, Any]]
) -> str | None:
    """Write the run's files, record what the live run logged, and ask the rule."""
    for old in tmp.iterdir():
        old.unlink()
    out = tmp / "rollouts.jsonl"
    write(out, ok)
    if failed:
        write(tmp / "rollouts_failures.jsonl", failed)
    (tmp / "rollouts_metrics.jsonl").write_text('{"metrics":{"a":1},"step":0,"time":1.0}\n')
    sent = LoggedRollouts()
    half = len(logged) // 2
    sent.add(logged[:half])  # batches of any size
    sent.add(logged[half:])
    run = RunArtifacts.from_path(out)
    identities = content_identities(run, use_cache=False)
    marker = RunIdMarker(
        exporter="x",
        run_id="r",
        logged={METRICS_JOURNAL: identities[METRICS_JOURNAL], ROLLOUTS: sent.identity()},
    )
    plan = ExportPlan(identities=identities, run_identity="i", upload_rollouts=True)
    return certify_refusal(marker, plan, "key", run)


@settings(max_examples=60, deadline=None)
@given(results=rows, split=st.data())
def test_any_split_between_the_rollouts_and_the_failures_sidecar_is_the_live_runs(
    tmp_path_factory: Any, results: list[dict[str, Any]], split: st.DataObject
) -> None:
    tmp = Path(tmp_path_factory.mktemp("split"))
    failed_mask = split.draw(st.lists(st.booleans(), min_size=len(results), max_size=len(results)))
    ok = [r for r, f in zip(results, failed_mask, strict=True) if not f]
    failed = [r for r, f in zip(results, failed_mask, strict=True) if f]
    order = split.draw(st.permutations(results))
    assert refusal_after(tmp, list(order), ok, failed) is None


pool = st.sampled_from([{"id": 1}, {"id": 2}, {"id": 2, "r": 0}, {"r": "x"}, {}])


def multiset(records: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in records)


@settings(max_examples=150, deadline=None)
@given(
    logged=st.lists(pool, min_size=1, max_size=5),
    ok=st.lists(pool, min_size=1, max_size=5),
    failed=st.lists(pool, max_size=3),
)
def test_the_live_run_is_the_runs_exactly_when_it_logged_the_rollouts_or_the_rollouts_and_failures(
    tmp_path_factory: Any,
    logged: list[dict[str, Any]],
    ok: list[dict[str, Any]],
    failed: list[dict[str, Any]],
) -> None:
    """Rows drawn from a small pool, so that near misses (one row more or less in either file, a
    duplicate, a changed row) are common: the rule accepts iff the multiset the live run sent is
    ``OUT.jsonl``'s or ``OUT.jsonl`` and ``OUT_failures.jsonl``'s together."""
    tmp = Path(tmp_path_factory.mktemp("rule"))
    expected = multiset(logged) in (multiset(ok), multiset(ok + failed))
    refusal = refusal_after(tmp, logged, ok, failed)
    assert (refusal is None) == expected, (refusal, logged, ok, failed)
    if refusal is not None:
        assert "rollouts" in refusal


captures = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.dictionaries(
        st.sampled_from(["calls", "mode"]),
        st.lists(
            st.dictionaries(
                st.sampled_from(["request", "response", "request_raw", "response_raw", "latency_ms"]),
                values,
                max_size=4,
            )
            | values,
            max_size=3,
        )
        | values,
        max_size=2,
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    results=rows,
    detail=st.lists(st.tuples(st.booleans(), st.booleans(), captures), min_size=12, max_size=12),
    failed_mask=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_nemo_gyms_exporter_view_of_the_files_is_the_live_runs(
    tmp_path_factory: Any,
    results: list[dict[str, Any]],
    detail: list[tuple[bool, bool, Any]],
    failed_mask: list[bool],
) -> None:
    """``observability_enabled``: results with any trajectory and captured calls (of any shape) in
    the files, NeMo Gym's exporter view of them sent live (mirrored from its 0.7.0 source)."""
    from tests.test_one_run_every_ending import rollout_for_export

    full = []
    for result, (trajectory, captured, capture) in zip(results, detail, strict=False):
        record = dict(result)
        if trajectory:
            record["ng_trajectory"] = {"steps": [1, 2]}
        if captured:
            record["ng_model_call_capture"] = capture
        full.append(record)
    ok = [r for r, f in zip(full, failed_mask, strict=False) if not f]
    failed = [r for r, f in zip(full, failed_mask, strict=False) if f]
    tmp = Path(tmp_path_factory.mktemp("view"))
    assert refusal_after(tmp, [rollout_for_export(r) for r in full], ok, failed) is None
