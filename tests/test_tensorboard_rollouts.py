"""The TensorBoard export's fast path over the rollouts past the table (``rollout_numbers``)
gives exactly what the reference path (the whole ``Rollout`` view of every row) gives, over odd
rollout shapes: missing or odd usage, non-numeric or non-finite rewards, integers past the
float range, numbers where the request or response is looked for, deep and long lines, records
that are not objects, blank lines and a torn last line. Read back from the real event files."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    HISTOGRAMS,
    TENSORS,
    EventAccumulator,
)

from gym_artifacts import export_run
from gym_artifacts._builtin_exporters import tensorboard as tensorboard_module
from gym_artifacts._builtin_exporters._rollouts import rollout_from_record
from gym_artifacts._builtin_exporters.tensorboard import rollout_numbers, token_counts
from gym_artifacts.contract.hooks import ExportStatus

# Keys the view treats apart (placement, timing, request and response candidates, the agent)
# and plain verdict names.
KEYS = st.sampled_from(
    ["reward", "score", "passed", "task_index", "_ng_task_index", "repeat", "latency_s",
     "duration_ms", "elapsed", "responses_create_params", "request", "input", "prompt",
     "response", "output", "completion", "agent_ref", "timestamp", "usage", "mask_sample"]
) | st.text(max_size=8)  # fmt: skip
NUMBERS = (
    st.integers(-(10**20), 10**20)
    | st.sampled_from([10**400, -(10**400), 2**63, 0, 1])  # past the float range, past int64
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
)
LEAVES = st.none() | NUMBERS | st.text(max_size=20)
TOKEN_VALUES = LEAVES | st.lists(st.integers(), max_size=2)
USAGE = st.dictionaries(
    st.sampled_from(["input_tokens", "output_tokens", "total_tokens", "cached_tokens"]), TOKEN_VALUES
) | LEAVES  # fmt: skip
RESPONSE = (
    st.fixed_dictionaries(
        {}, optional={"usage": USAGE, "output_text": st.text(max_size=20), "created_at": NUMBERS}
    )
    | LEAVES
    | st.lists(LEAVES, max_size=3)
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=8
)
RECORDS = st.dictionaries(KEYS, VALUES | RESPONSE, max_size=8) | st.lists(LEAVES, max_size=3) | LEAVES


def reference_numbers(record: Any) -> list[tuple[str, float]]:
    """The histogram values of a record as the reference path takes them: the whole view."""
    r = rollout_from_record(0, record)
    return [*r.verdicts.items(), *token_counts(r.response).items()]


def same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    """Equal pairs, NaN equal to NaN (a token count may be NaN; the histogram drops it)."""
    return len(a) == len(b) and all(
        ka == kb and (va == vb or (math.isnan(va) and math.isnan(vb)))
        for (ka, va), (kb, vb) in zip(a, b, strict=True)
    )


@settings(max_examples=400, deadline=None)
@given(RECORDS)
def test_rollout_numbers_are_the_views_numbers(record: Any) -> None:
    assert same(rollout_numbers(record), reference_numbers(record))


def deep(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = {"x": [value]}
    return value


def write_run(dpath: Path, records: list[Any], blank_after: set[int], torn: bool, padding: int) -> Path:
    """A run of these rollouts (as Python's json writes them: NaN, huge integers), with blank
    lines, a long line and a torn last line where asked; aggregate metrics after them."""
    dpath.mkdir(parents=True, exist_ok=True)
    out = dpath / "run.jsonl"
    lines = []
    for i, record in enumerate(records):
        if i == 0 and isinstance(record, dict):
            record = {**record, "trace": deep(120), "padding": "x" * padding}
        lines.append(json.dumps(record) + "\n")
        if i in blank_after:
            lines.append("\n  \n")
    if torn:
        lines.append('{"reward": 0.5, "response": {"usage": {"input_')
    out.write_text("".join(lines))
    agg = dpath / "run_aggregate_metrics.json"
    agg.write_text(json.dumps([{"agent_ref": {"name": "agent"}, "agent_metrics": {"mean/reward": 0.5}}]))
    later = time.time() + 5
    os.utime(agg, (later, later))
    return out


def exported(out: Path, logdir: Path, table_rows: int) -> EventAccumulator:
    cfg = OmegaConf.create(
        {"exporters": {"tensorboard": {"enabled": True, "logdir": str(logdir), "table_rows": table_rows}}}
    )
    [result] = export_run(out, cfg, accept_partial_line=True)
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = EventAccumulator(str(logdir / result.backend_run_id), size_guidance={TENSORS: 0, HISTOGRAMS: 0})
    acc.Reload()
    return acc


def histograms(acc: EventAccumulator) -> dict[str, list[Any]]:
    return {
        tag: [(e.step, e.histogram_value) for e in acc.Histograms(tag)] for tag in acc.Tags()["histograms"]
    }


def scalars(acc: EventAccumulator) -> dict[str, list[Any]]:
    """Every ``rollout/`` scalar event: tag, step and value (the wall time of a row without a
    time of its own in a run without one is the export's: not compared)."""
    tags = [t for t in acc.Tags()["scalars"] if t.startswith("rollout/")]
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}


def table_rows(acc: EventAccumulator) -> list[str]:
    if "rollouts/table" not in acc.Tags()["tensors"]:
        return []
    chunks = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("rollouts/table")]
    return [line for chunk in chunks for line in chunk.splitlines()[2:]]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(RECORDS, min_size=1, max_size=12),
    blank_after=st.sets(st.integers(0, 11), max_size=3),
    torn=st.booleans(),
    padding=st.sampled_from([0, 300_000]),
    shown=st.integers(0, 12),
)
def test_fast_path_gives_the_reference_histograms_and_table(
    tmp_path_factory: pytest.TempPathFactory,
    records: list[Any],
    blank_after: set[int],
    torn: bool,
    padding: int,
    shown: int,
) -> None:
    """Every row past the table (``table_rows: 0``) against every row through the view
    (``table_rows`` above the row count): the same histogram events, tag for tag, bucket for
    bucket; and a table of the first ``shown`` rows is those rows of the full table."""
    tmp = tmp_path_factory.mktemp("run")
    out = write_run(tmp / "run", records, blank_after, torn, padding)
    fast = exported(out, tmp / "fast", 0)  # every row's values from the export's one read
    with pytest.MonkeyPatch.context() as patch:  # every row parsed by TensorBoard itself
        patch.setattr(tensorboard_module, "rollout_row_values", lambda run: None)
        reference = exported(out, tmp / "reference", 100_000)
    assert histograms(fast) == histograms(reference)
    assert scalars(fast) == scalars(reference)  # the first export's rows from the one read, the second's parsed
    assert table_rows(fast) == []
    full = table_rows(reference)
    assert len(full) == len(records)
    assert table_rows(exported(out, tmp / "shown", shown)) == full[:shown]
