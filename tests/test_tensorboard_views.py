"""What TensorBoard shows of a NeMo Gym run (issue 39), read back from the real event files:
per-rollout values over the rollouts' completion order, Distributions with more than one step
(a one-step histogram draws as a blank chart), a rollouts table with every planned rollout
(failed ones too), its tool calls and tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    HISTOGRAMS,
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.test_mlflow_traces import fixture_run


def test_tensorboard_shows_each_rollout_distributions_and_a_full_table(tmp_path: Path) -> None:
    rollouts = fixture_run(tmp_path)
    cfg = OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}}})
    [result] = export_run(rollouts, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = EventAccumulator(str(tmp_path / "tb" / result.backend_run_id),
                           size_guidance={TENSORS: 0, HISTOGRAMS: 0, SCALARS: 0})  # fmt: skip
    acc.Reload()
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    # each rollout's reward at its index in completion order (OUT.jsonl's line order)
    rewards = acc.Scalars("rollout/reward")
    assert [(e.step, e.value) for e in rewards] == [(i, r["reward"]) for i, r in enumerate(records)]
    assert [e.step for e in acc.Scalars("rollout/total_tokens")] == list(range(len(records)))
    # Distributions: each histogram at more than one step
    tags = acc.Tags()["histograms"]
    assert "rollouts/reward" in tags
    assert all(len({e.step for e in acc.Histograms(t)}) > 1 for t in tags)
    # the table: 10 planned rollouts, the 2 failed ones with their failure, tool calls and tokens
    chunks = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("rollouts/table")]
    header = chunks[0].splitlines()[0]
    assert all(c in header for c in ("prompt", "answer", "tool_calls", "total_tokens", "reward", "failure"))
    rows = [line for chunk in chunks for line in chunk.splitlines()[2:]]
    assert len(rows) == 10
    assert sum("ClientResponseError" in row for row in rows) == 2
    assert any("get_weather(" in row for row in rows) and any("| 96 |" in row for row in rows)
