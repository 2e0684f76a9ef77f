"""One trajectory per rollout (gym_artifacts.run.trajectory): NeMo Gym's rollout evidence read
when present, one definition of a rollout's verdicts in every view, the run's times from its
rollouts (never from file times)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters._rollouts import rollout_from_record
from exporters.tensorboard import rollout_numbers
from gym_artifacts.run.artifacts import RunArtifacts
from gym_artifacts.run.rollout_spans import LLM, TOOL, rollout_trace
from gym_artifacts.run.times import run_times
from gym_artifacts.run.trajectory import rollout_verdicts, trajectory_of
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.nemo_gym_observability import observability_run

WITH_FAILURES = NEMO_GYM_FIXTURES / "with-failures"


def lines(fpath: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in fpath.read_text().splitlines()]


def test_evidence_gives_every_model_call_its_own_times_tokens_and_metadata(tmp_path: Path) -> None:
    for row, record in enumerate(lines(observability_run(tmp_path / "run"))):
        evidence, perf = record["ng_trajectory"], record["ng_perf"]
        trajectory = trajectory_of(row, record)
        assert trajectory.source == "ng_trajectory"
        calls = trajectory.model_calls
        assert len(calls) == len(evidence["model_calls"]) == perf["num_turns"]
        for call, raw in zip(calls, evidence["model_calls"], strict=True):
            assert (call.start_s, call.end_s) == (raw["started_at"], raw["completed_at"])
            assert call.usage is not None and call.usage.input_tokens == raw["token_stats"]["prompt_tokens"]
            assert (
                call.usage.cached_tokens == 0 and call.ttft_ms == raw["response_metadata"]["latency_ttft_ms"]
            )
            assert call.finish_reason == raw["response_metadata"]["finish_reason"]
        assert trajectory.usage["input_tokens"] == perf["prompt_tokens"]
        assert trajectory.usage["output_tokens"] == perf["completion_tokens"]
        assert [(t.call_id, t.status, t.start_s) for t in trajectory.tool_calls] == [
            (t["tool_call_id"], t["status"], t["started_at"]) for t in evidence["tool_calls"]
        ]
        assert trajectory.start_s == evidence["model_calls"][0]["started_at"]
        assert trajectory.duration_s == pytest.approx(perf["total_latency_ms"] / 1000)

        trace = rollout_trace("s", row, record, fallback_s=1.0)
        assert all(s.end_ns > s.start_ns for s in trace.spans)  # every span has a real duration
        llms = [s for s in trace.spans if s.kind == LLM]
        assert all(s.usage and s.usage["input_tokens"] > 0 for s in llms)  # tokens on every call
        assert all(s.tools and s.tools[0]["name"] == "get_weather" for s in llms)
        assert all("times" not in s.attributes for s in trace.spans)  # none placed
        tools = [s for s in trace.spans if s.kind == TOOL]
        assert all(s.error is None and s.inputs == {"city": "San Francisco"} and s.outputs for s in tools)


def test_without_evidence_the_response_gives_the_steps_and_places_them(tmp_path: Path) -> None:
    record = lines(WITH_FAILURES / "rollouts.jsonl")[-1]
    trajectory = trajectory_of(0, record)
    assert trajectory.source == "responses" and trajectory.start_s == record["response"]["created_at"]
    trace = rollout_trace("s", 0, record, fallback_s=1.0)
    assert all(s.attributes.get("times") == "placed" for s in trace.spans[1:])
    assert [s.usage for s in trace.spans if s.kind == LLM][-1]["input_tokens"] == record["response"]["usage"][
        "input_tokens"
    ]


values = st.one_of(
    st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
    st.none(), st.lists(st.integers(), max_size=2),
)  # fmt: skip
names = st.sampled_from(
    ["reward", "accuracy", "_ng_extra", "mask_sample", "latency_s", "passed", "score", "_x"]
)


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(names, values, max_size=6))
def test_every_view_reads_the_same_verdicts(extra: dict[str, Any]) -> None:
    """Booleans count as 0/1 (as NeMo Gym's aggregate counts them), infinities and NaN are no
    verdict, ``_``-prefixed, placement and timing fields never are: the same in the trace, the
    rollout view of the run backends and TensorBoard's histograms."""
    record = {"responses_create_params": {"input": "hi"}, "response": {"output": []}, **extra}
    verdicts = rollout_verdicts(record)
    assert all(math.isfinite(v) for v in verdicts.values())
    assert not any(k.startswith("_") or k in ("mask_sample", "latency_s") for k in verdicts)
    assert all(k in verdicts for k, v in extra.items() if isinstance(v, bool) and not k.startswith("_")
               and k not in ("mask_sample", "latency_s"))  # fmt: skip
    assert rollout_trace("s", 0, record, 1.0).feedback == verdicts
    assert rollout_from_record(0, record).verdicts == verdicts
    assert dict(rollout_numbers(record)) == verdicts
    if "reward" in verdicts:
        assert next(iter(verdicts)) == "reward"


def _copy_run(tmp_path: Path, source: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    for f in folder.iterdir():  # a copy made long after the eval: its file times say nothing
        os.utime(f, (2_000_000_000, 2_000_000_000))
    return folder / "rollouts.jsonl"


def test_run_times_come_from_the_rollouts_never_from_file_times(tmp_path: Path) -> None:
    out = _copy_run(tmp_path, WITH_FAILURES)
    times = run_times(RunArtifacts.from_path(out))
    created = [r["response"]["created_at"] for r in lines(out)]
    assert times is not None and times.source == "rollouts"
    assert (times.start, times.end) == (min(created), max(created))


def test_evidence_run_times_span_the_first_call_to_the_last_rollout_end(tmp_path: Path) -> None:
    out = observability_run(tmp_path / "run")
    for f in out.parent.iterdir():
        os.utime(f, (2_000_000_000, 2_000_000_000))
    times = run_times(RunArtifacts.from_path(out))
    records = lines(out)
    starts = [r["ng_trajectory"]["model_calls"][0]["started_at"] for r in records]
    ends = [s + r["ng_perf"]["total_latency_ms"] / 1000 for s, r in zip(starts, records, strict=True)]
    assert times is not None and times.source == "rollouts"
    assert times.start == min(starts) and times.end == pytest.approx(max(ends))
    assert times.end - times.start > 0.3


def test_a_run_whose_rollouts_hold_no_time_has_no_times(tmp_path: Path) -> None:
    out = tmp_path / "run" / "rollouts.jsonl"
    out.parent.mkdir()
    out.write_text('{"reward": 1}\n{"reward": 0}\n')
    assert run_times(RunArtifacts.from_path(out)) is None


def test_a_real_observability_run_gives_every_span_its_time_and_every_model_call_its_tokens() -> None:
    """NeMo Gym 0.7.0's own output with ``observability_enabled`` (tests/fixtures/.../observability,
    made with its CLI): the trajectory agrees with NeMo Gym's own ``ng_perf`` of each rollout."""
    run = NEMO_GYM_FIXTURES / "observability" / "rollouts.jsonl"
    records = lines(run)
    assert records
    for row, record in enumerate(records):
        perf = record["ng_perf"]
        trajectory = trajectory_of(row, record)
        assert trajectory.source == "ng_trajectory"
        assert len(trajectory.model_calls) == perf["num_turns"]
        assert len(trajectory.tool_calls) == perf["num_tool_calls"]
        assert trajectory.usage["input_tokens"] == perf["prompt_tokens"]
        assert trajectory.usage["output_tokens"] == perf["completion_tokens"]
        assert trajectory.duration_s == pytest.approx(perf["total_latency_ms"] / 1000)
        trace = rollout_trace("s", row, record, fallback_s=1.0)
        assert all(s.end_ns > s.start_ns and "times" not in s.attributes for s in trace.spans)
        assert all(s.usage and s.usage["total_tokens"] > 0 for s in trace.spans if s.kind == LLM)
        assert all(s.error is None for s in trace.spans if s.kind == TOOL)
    times = run_times(RunArtifacts.from_path(run))
    assert times is not None and times.source == "rollouts" and times.end > times.start


def test_token_details_reach_each_platform_in_its_own_shape(tmp_path: Path) -> None:
    """Cached and reasoning tokens of a model call: LangSmith's usage_metadata details, MLflow's
    tokenUsage keeps its three counts; the root carries none (platforms sum the model calls')."""
    from exporters._mlflow_traces import span_attributes
    from exporters.langsmith import usage_metadata

    record = json.loads(observability_run(tmp_path / "run").read_text().splitlines()[-1])
    record["ng_trajectory"]["model_calls"][0]["token_stats"]["reasoning_tokens"] = 7
    trace = rollout_trace("s", 0, record, 1.0)
    first = next(s for s in trace.spans if s.kind == LLM)
    assert usage_metadata(first.usage or {})["output_token_details"] == {"reasoning": 7}
    assert usage_metadata(first.usage or {})["input_token_details"] == {"cache_read": 0}
    assert set(span_attributes(trace, first)["mlflow.chat.tokenUsage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert "mlflow.chat.tokenUsage" not in span_attributes(trace, trace.root)
