"""The MLflow exporter's bookkeeping lives in one tag, ``gym_artifacts``, and runs are found by it.

Read back with ``MlflowClient`` from a SQLite store and from a real ``mlflow server``: an exported
run's tags are MLflow's own (``mlflow.*``), the user's configured tags, the run's text metrics
and the one bookkeeping tag; a lookup by a bookkeeping value finds exactly the runs holding it,
whatever ``%``, ``_`` or quotes other runs' bookkeeping holds, and refuses a value that would
widen its ``LIKE`` pattern.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters._mlflow_bookkeeping import (
    BOOKKEEPING_TAG,
    MAX_TAG_VALUE,
    bookkeeping_of,
    encode,
    lookup_filter,
)
from gym_artifacts._builtin_exporters._mlflow_client import RequestLimits, ScopedMlflow
from gym_artifacts.contract.hooks import ExportStatus


@pytest.mark.slow
def test_exported_run_shows_only_mlflow_user_and_one_bookkeeping_tag(
    quickstart_run: Path, tracking_uri: str
) -> None:
    section = {
        "enabled": True, "tracking_uri": tracking_uri, "experiment_name": "bookkeeping",
        "tags": {"team": "evals"},
    }  # fmt: skip
    [result] = export_run(quickstart_run, OmegaConf.create({"exporters": {"mlflow": section}}))
    assert result.status is ExportStatus.EXPORTED, result.reason
    tags = MlflowClient(tracking_uri).get_run(result.backend_run_id).data.tags
    # the run's own text metrics (an aggregate's string values, "<agent>/<key>") stay tags: its data
    aggregate = quickstart_run.with_name("eval_aggregate_metrics.json").read_text()
    texts = {k for k in tags if "/" in k and json.dumps(tags[k]) in aggregate}
    others = {k for k in tags if not k.startswith("mlflow.")} - texts
    assert others == {BOOKKEEPING_TAG, "team"}, sorted(others)
    assert not any(k.startswith("gym_artifacts.") for k in tags)
    kept = bookkeeping_of(tags)
    assert kept["complete"] == "true" and kept["identity"].startswith("b3:")
    assert kept["kind"] == "post-run" and kept["bytes_digest"] and kept["export_attempt"]
    assert tags[BOOKKEEPING_TAG] == json.dumps(kept, sort_keys=True, separators=(",", ":"))
    # a second export finds the run by the bookkeeping tag: no second run
    [again] = export_run(quickstart_run, OmegaConf.create({"exporters": {"mlflow": section}}))
    assert again.status in (ExportStatus.EXPORTED, ExportStatus.SKIPPED)
    runs = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("bookkeeping").experiment_id]
    )
    assert [r.info.run_id for r in runs] == [result.backend_run_id]


HOSTILE = ['%', '_', "'", '"', "\\", '%"identity":"abc"%', "a_c", "ab%", "x' OR '1'='1"]


def test_lookup_never_matches_another_runs_bookkeeping(tracking_uri: str) -> None:
    """Runs whose free-text bookkeeping spells another run's identity, or whose keys differ from
    ``bytes_digest`` only where ``LIKE``'s ``_`` matches, are not found by that identity."""
    ml = ScopedMlflow(tracking_uri, None, RequestLimits(30, 0))
    experiment = ml.experiment_id("bookkeeping-lookup", None)
    target = ml.create_run(experiment, "target", {}, 1, {"identity": "abc", "bytes_digest": "d1"})
    decoys = [
        ml.create_run(experiment, f"decoy{i}", {}, 2 + i, {"source": text, "identity": "abcd"})
        for i, text in enumerate(HOSTILE)
    ]
    decoys.append(ml.create_run(experiment, "key", {}, 50, {"bytesXdigest": "d1", "identity": "ab"}))
    decoys.append(ml.create_run(experiment, "upper", {}, 51, {"identity": "ABC"}))
    fresh = ScopedMlflow(tracking_uri, None, RequestLimits(30, 0))
    assert [r.info.run_id for r in fresh.find_runs(experiment, "identity", "abc")] == [target]
    assert [r.info.run_id for r in fresh.find_runs(experiment, "bytes_digest", "d1")] == [target]
    assert fresh.find_runs(experiment, "identity", "ab")  # the decoy keyed "ab" is found by its own value
    assert len(decoys) == len(HOSTILE) + 2
    # an update keeps every other entry (read-modify-write through a client that never saw the run)
    fresh2 = ScopedMlflow(tracking_uri, None, RequestLimits(30, 0))
    fresh2.set_tags(target, {"note": "x"}, {"complete": "true"})
    assert bookkeeping_of(MlflowClient(tracking_uri).get_run(target).data.tags) == {
        "identity": "abc", "bytes_digest": "d1", "complete": "true",
    }  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_lookup_refuses_values_that_widen_the_pattern(value: str) -> None:
    """Any value holding ``%``, ``_``, a quote, a backslash or anything outside a digest's
    alphabet is refused; every accepted one appears in the filter exactly as encoded."""
    if set(value) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.:-"):
        assert f'"identity":"{value}"' in lookup_filter("identity", value)
    else:
        with pytest.raises(ValueError):
            lookup_filter("identity", value)


@given(st.text(max_size=20_000), st.text(max_size=20_000))
@settings(max_examples=30, deadline=None)
def test_bookkeeping_fits_mlflows_tag_limit_and_keeps_what_runs_are_found_by(a: str, b: str) -> None:
    entries = {"identity": "b3:" + "f" * 64, "export_attempt": "a" * 32, "source": a, "nvml": b}
    text = encode(entries)
    assert len(text) <= MAX_TAG_VALUE
    back = bookkeeping_of({BOOKKEEPING_TAG: text})
    assert back["identity"] == entries["identity"] and back["export_attempt"] == entries["export_attempt"]
