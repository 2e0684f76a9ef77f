"""A NeMo Gym run with rollout evidence (``observability_enabled: true``), in NeMo Gym's shapes.

Until a run made with NeMo Gym's own CLI sits beside the other fixtures, this writes one from the
real ``with-failures`` fixture: each rollout line gains ``ng_trajectory`` (NeMo Gym 0.7.0's
``nemo_gym.rollout_observability.TrajectoryRecord``: one root invocation with its conversation,
``model_calls`` with request, response, wall-clock times, ``token_stats`` and
``response_metadata``, ``tool_calls`` with times, status and output) and ``ng_perf`` (as
``rollout_collection._build_ng_perf`` sums it), and the aggregate gains ``perf_summary``. Each
model call of a rollout takes 350 ms (first token at 120 ms), each tool call 50 ms, from the
Response's ``created_at``; each call's tokens are its share of the Response's ``usage``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.fixture_paths import NEMO_GYM_FIXTURES

MODEL_CALL_S, TOOL_CALL_S, TTFT_MS = 0.35, 0.05, 120.0
MODEL_REF = {"type": "responses_api_models", "name": "policy_model"}


def _turns(output: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    turns: list[list[dict[str, Any]]] = [[]]
    for item in output:
        if item["type"] == "function_call_output":
            if turns[-1]:
                turns.append([])
            continue
        turns[-1].append(item)
    return [t for t in turns if t]


def with_evidence(record: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """``record`` with ``ng_trajectory`` and ``ng_perf`` as NeMo Gym writes them."""
    response, request = record["response"], record["responses_create_params"]
    output = response["output"]
    turns = _turns(output)
    results = {i["call_id"]: i["output"] for i in output if i["type"] == "function_call_output"}
    usage = response["usage"]
    history = [i for i in request["input"]]
    at = response["created_at"]
    model_calls, tool_calls, refs = [], [], []
    for n, turn in enumerate(turns):
        share = {k: usage[k] // len(turns) + (usage[k] % len(turns) if n == len(turns) - 1 else 0)
                 for k in ("input_tokens", "output_tokens")}  # fmt: skip
        call_id = f"mc-{rollout_id}-{n}"
        refs.append({"model_call_id": call_id})
        model_calls.append({
            "model_call_id": call_id, "started_at": at, "completed_at": at + MODEL_CALL_S,
            "duration_ms": MODEL_CALL_S * 1000,
            "request": {"model": "fake-model", "input": list(history), "tools": request["tools"]},
            "response": {"id": f"resp-{call_id}", "model": "fake-model", "object": "response",
                         "output": turn, "status": "completed",
                         "usage": {**share, "total_tokens": sum(share.values())}},
            "response_metadata": {"response_id": f"resp-{call_id}", "model_ref": MODEL_REF, "model": "fake-model",
                                  "dialect": "responses", "status_code": 200, "response_status": "completed",
                                  "finish_reason": "tool_calls" if any(i["type"] == "function_call" for i in turn)
                                  else "stop", "latency_ttft_ms": TTFT_MS},
            "token_stats": {"prompt_tokens": share["input_tokens"], "completion_tokens": share["output_tokens"],
                            "reasoning_tokens": None, "total_tokens": sum(share.values()), "cached_tokens": 0},
        })  # fmt: skip
        at += MODEL_CALL_S
        history.extend(turn)
        for call in (i for i in turn if i["type"] == "function_call"):
            tool_calls.append({
                "kind": "tool_call", "invocation_id": "root", "tool_call_id": call["call_id"], "sandbox_id": None,
                "tool_name": call["name"], "started_at": at, "completed_at": at + TOOL_CALL_S,
                "duration_ms": TOOL_CALL_S * 1000, "timing_source": "executor", "status": "completed",
                "error_type": None, "output": results[call["call_id"]],
            })  # fmt: skip
            history.append({"type": "function_call_output", "call_id": call["call_id"],
                            "output": results[call["call_id"]]})  # fmt: skip
            at += TOOL_CALL_S
    task_id = str(record["_ng_task_index"])
    trajectory = {
        "schema_version": "1.0", "task_id": task_id, "rollout_id": rollout_id,
        "invocations": [{"kind": "agent_invocation", "invocation_id": "root", "parent_invocation_id": None,
                         "spawned_by_tool_call_id": None, "status": "completed", "duration_ms": None,
                         "error_type": None, "model_calls": refs, "conversation": history}],
        "turns": [], "model_calls": model_calls, "tool_calls": tool_calls, "gaps": [],
    }  # fmt: skip
    latency_ms = round((at - response["created_at"]) * 1000 + 20, 3)  # + verification
    perf = {"num_turns": len(turns), "num_tool_calls": len(tool_calls), "token_observability_coverage": 1.0,
            "prompt_tokens": usage["input_tokens"], "cached_prompt_tokens": 0,
            "completion_tokens": usage["output_tokens"], "total_latency_ms": latency_ms}  # fmt: skip
    return {**record, "ng_trajectory": trajectory, "ng_perf": perf}


def observability_run(folder: Path) -> Path:
    """The with-failures fixture with rollout evidence, written under ``folder``; its ``OUT.jsonl``."""
    source = NEMO_GYM_FIXTURES / "with-failures"
    folder.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        shutil.copy(f, folder / f.name)
    lines = []
    perfs = []
    for n, line in enumerate((source / "rollouts.jsonl").read_text().splitlines()):
        record = with_evidence(json.loads(line), f"r{n}")
        perfs.append(record["ng_perf"])
        lines.append(json.dumps(record))
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    aggregate = json.loads((source / "rollouts_aggregate_metrics.json").read_text())
    latencies = sorted(p["total_latency_ms"] for p in perfs)
    for entry in aggregate:
        entry["perf_summary"] = {
            "overall_observability_coverage": len(perfs) / 10, "token_observability_coverage": len(perfs) / 10,
            "mean_prompt_tokens": sum(p["prompt_tokens"] for p in perfs) / len(perfs),
            "mean_num_turns": sum(p["num_turns"] for p in perfs) / len(perfs),
            "total_latency_p50_ms": latencies[len(latencies) // 2],
            "total_latency_mean_ms": sum(latencies) / len(latencies),
        }  # fmt: skip
    (folder / "rollouts_aggregate_metrics.json").write_text(json.dumps(aggregate))
    return folder / "rollouts.jsonl"
