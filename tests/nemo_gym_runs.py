"""Runs written in NeMo Gym 0.7's real output format, at any number of tasks and repeats.

The layout, field names and statistics follow what NeMo Gym 0.7.0's own rollout collection wrote
for ``tests/fixtures/nemo-gym-0.7.0`` (``test_nemo_gym.py`` checks the generated files
against those fixtures key by key): ``OUT.jsonl`` (Responses API request and full Response
object per line, in completion order), ``OUT_aggregate_metrics.json`` (one entry per agent:
``agent_metrics``, ``key_metrics``, ``group_level_metrics`` keyed by ``_ng_task_index`` with
``rollout_infos``, ``repeat_level_metrics`` keyed by ``_ng_rollout_index``),
``OUT_failures.jsonl`` (failed rollouts routed to the sidecar) and
``OUT_materialized_inputs.jsonl`` (every planned input). Used by the quickstart's
``make_run.py`` and by the tests that need a large run.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are a helpful personal assistant that aims to be helpful and reduce any pain points the user has."
)
CITIES = ["San Francisco", "New York", "Paris", "Tokyo", "Lagos", "Lima"]
VALUES = ("reward", "input_tokens", "output_tokens", "total_tokens")
TOOLS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": ""}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
        "type": "function",
        "description": "",
    }
]
# Two-sided 95% Student t quantiles by degrees of freedom (NeMo Gym's confidence intervals).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t (normal beyond 30 degrees of freedom, close enough)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def _std(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ci(xs: Sequence[float]) -> tuple[float, float, float]:
    """(standard error, low, high) of the mean at 95%."""
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return 0.0, mean, mean
    se = _std(xs) / math.sqrt(len(xs))
    half = t975(len(xs) - 1) * se
    return se, mean - half, mean + half


def _basic(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """``mean/max/min/median/std`` of each value, in NeMo Gym's key order."""
    out: dict[str, float] = {}
    for stat, fn in (
        ("mean", statistics.fmean),
        ("max", max),
        ("min", min),
        ("median", statistics.median),
        ("std", _std),
    ):
        for v in VALUES:
            out[f"{stat}/{v}"] = float(fn([r[v] for r in rows]))
    return out


def _across_repeats(by_repeat: dict[int, list[dict[str, float]]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in sorted(VALUES):
        means = [statistics.fmean(r[v] for r in rows) for _, rows in sorted(by_repeat.items())]
        se, low, high = _ci(means)
        out[f"mean_across_repeats/mean/{v}"] = statistics.fmean(means)
        out[f"median_across_repeats/mean/{v}"] = float(statistics.median(means))
        out[f"std_across_repeats/mean/{v}"] = _std(means)
        out[f"min_across_repeats/mean/{v}"] = min(means)
        out[f"max_across_repeats/mean/{v}"] = max(means)
        out[f"se_across_repeats/mean/{v}"] = se
        out[f"ci_low_95_across_repeats/mean/{v}"] = low
        out[f"ci_high_95_across_repeats/mean/{v}"] = high
    return out


def _repeat_entry(index: int, rows: list[dict[str, float]]) -> dict[str, Any]:
    entry: dict[str, Any] = {"_ng_rollout_index": index, "sample_count": len(rows), "missing_count": 0}
    for v in sorted(VALUES):
        xs = [r[v] for r in rows]
        se, low, high = _ci(xs)
        entry.update({
            f"mean/{v}": statistics.fmean(xs), f"median/{v}": float(statistics.median(xs)),
            f"std/{v}": _std(xs), f"sem/{v}": se, f"min/{v}": float(min(xs)), f"max/{v}": float(max(xs)),
            f"p25/{v}": _quantile(xs, 0.25), f"p75/{v}": _quantile(xs, 0.75),
            f"ci_low_95/{v}": low, f"ci_high_95/{v}": high,
        })  # fmt: skip
    return entry


def _group_entry(task: int, rows: list[dict[str, float]], repeats: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"_ng_task_index": task, **_basic(rows)}
    entry.update(
        sample={"agent_ref": {"name": "agent"}},
        num_rollouts=len(rows),
        expected_num_rollouts=repeats,
        missing_num_rollouts=repeats - len(rows),
        reward_profile_completion_pct=100.0 * len(rows) / repeats,
        rollout_infos=[
            {
                "rollout_id": f"{task}:{r['_ng_rollout_index']}",
                "_ng_task_index": task,
                "_ng_rollout_index": r["_ng_rollout_index"],
                **{v: r[v] for v in VALUES},
            }
            for r in sorted(rows, key=lambda r: r["_ng_rollout_index"])
        ],
    )
    return entry


def aggregate(
    agent: str, environment_server: str, infos: list[dict[str, Any]], repeats: int
) -> dict[str, Any]:
    """One agent's aggregate entry from its scored rollouts' infos."""
    by_task: dict[int, list[dict[str, float]]] = {}
    by_repeat: dict[int, list[dict[str, float]]] = {}
    for info in infos:
        by_task.setdefault(info["_ng_task_index"], []).append(info)
        by_repeat.setdefault(info["_ng_rollout_index"], []).append(info)
    basic = _basic(infos)
    return {
        "agent_ref": {"name": agent},
        "_ng_environment_server": environment_server,
        "agent_metrics": {**basic, **_across_repeats(by_repeat), "num_repeats": repeats},
        "key_metrics": {k: basic[k] for k in basic if k.startswith("mean/")},
        "group_level_metrics": [_group_entry(t, rows, repeats) for t, rows in sorted(by_task.items())],
        "repeat_level_metrics": [_repeat_entry(i, rows) for i, rows in sorted(by_repeat.items())],
    }


def _prompt(task: int) -> tuple[str, str | None]:
    """The user's question and, for tasks the model answers with a tool call, the city."""
    city = CITIES[task % len(CITIES)]
    if task % 5 in (2, 3):
        return ("humidity in sf" if task % 5 == 2 else "how about tomorrow?"), None
    return f"what's it like in {city}?", city


def _request(question: str, *, full: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"content": SYSTEM_PROMPT, "role": "developer"},
        {"content": question, "role": "user"},
    ]
    if not full:
        return {"input": messages, "tools": TOOLS}
    for m in messages:
        m.update(type="message", phase=None)
    return {"background": None, "input": messages, "model": None, "parallel_tool_calls": True,
            "temperature": None, "tool_choice": "auto", "tools": TOOLS, "top_p": None}  # fmt: skip


def _response(task: int, repeat: int, city: str | None, usage: tuple[int, int]) -> dict[str, Any]:
    call_id = f"call_{task:05d}{repeat:03d}"
    output: list[dict[str, Any]] = []
    if city is not None:
        output.append({"arguments": json.dumps({"city": city}), "call_id": call_id, "name": "get_weather",
                       "type": "function_call", "id": call_id, "status": "completed", "namespace": None})  # fmt: skip
        result = {"city": city, "weather_description": f"The weather in {city} is cold."}
        output.append({"call_id": call_id, "output": json.dumps(result, separators=(",", ":")),
                       "type": "function_call_output", "id": None, "status": None})  # fmt: skip
        text = f"It is cold in {city}; bring a jacket."
    else:
        text = "Which city do you mean?"
    output.append({
        "id": f"msg_{task:05d}{repeat:03d}",
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant", "status": "completed", "type": "message", "phase": None,
    })  # fmt: skip
    inp, out = usage
    return {
        "id": f"resp_{task:05d}{repeat:03d}", "created_at": 1796081816.0 + task, "error": None,
        "incomplete_details": None, "model": "quickstart-policy", "object": "response", "output": output,
        "parallel_tool_calls": True, "status": "completed", "tool_choice": "auto", "tools": TOOLS,
        "usage": {"input_tokens": inp, "input_tokens_details": {"cached_tokens": None}, "output_tokens": out,
                  "output_tokens_details": {"reasoning_tokens": None}, "total_tokens": inp + out},
    }  # fmt: skip


def write_run(
    rollouts_fpath: Path,
    *,
    tasks: int,
    repeats: int,
    agents: Sequence[str] = ("example_single_tool_call_simple_agent",),
    failing_tasks: Sequence[int] = (),
    seed: int = 0,
    reward_of: Callable[[int, int], float] | None = None,
) -> Path:
    """Write a NeMo Gym 0.7 run at ``rollouts_fpath`` (``OUT.jsonl``) and its sidecars.

    Task ``t`` belongs to agent ``agents[t % len(agents)]``; every repeat of a task in
    ``failing_tasks`` fails and goes to ``OUT_failures.jsonl``, as with NeMo Gym's
    ``+route_failures_to_sidecar=true``. Aggregate metrics are written last (newest file).
    ``reward_of(task, repeat)``, when given, replaces the default reward (1 for the tasks the model
    answers with a tool call, else 0).
    """
    rng = random.Random(seed)
    rollouts_fpath.parent.mkdir(parents=True, exist_ok=True)
    stem = rollouts_fpath.with_suffix("")
    failing = set(failing_tasks)
    planned = [(t, r) for t in range(tasks) for r in range(repeats)]
    done = planned[:]
    rng.shuffle(done)  # NeMo Gym writes lines in completion order
    infos: dict[str, list[dict[str, Any]]] = {a: [] for a in agents}
    env = {a: a.removesuffix("_simple_agent") + "_environment_server" for a in agents}
    with open(stem.with_name(stem.name + "_materialized_inputs.jsonl"), "w") as fh:
        for t, r in planned:
            agent = agents[t % len(agents)]
            line = {"responses_create_params": _request(_prompt(t)[0], full=False),
                    "agent_ref": {"name": agent}, "_ng_task_index": t, "_ng_rollout_index": r}  # fmt: skip
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")
    with open(rollouts_fpath, "w") as out, open(stem.with_name(stem.name + "_failures.jsonl"), "w") as fails:
        for t, r in done:
            agent = agents[t % len(agents)]
            common = {"_ng_task_index": t, "_ng_rollout_index": r, "agent_ref": {"name": agent},
                      "_ng_environment_server": env[agent], "_ng_result_type": "legacy_agent"}  # fmt: skip
            if t in failing:
                failure = {
                    "_ng_failure_class": "agent_run_error",
                    "_ng_failure_type": "ClientResponseError",
                    "_ng_failure_message": "500, message='Internal Server Error', url='http://127.0.0.1:11694/run'",
                    "_ng_failure_http_status": 500,
                    "_ng_failure_response_body": '"injected failure (fail_flag)"',
                }
                fails.write(json.dumps({**failure, **common}, separators=(",", ":")) + "\n")
                continue
            question, city = _prompt(t)
            usage = (80, 16) if city else (40, 6)
            usage = (usage[0] + rng.randint(0, 8), usage[1] + rng.randint(0, 4))
            reward = 1.0 if city is not None else 0.0
            if reward_of is not None:
                reward = float(reward_of(t, r))
            line = {
                "responses_create_params": _request(question, full=True),
                "response": _response(t, r, city, usage),
                "reward": reward, "mask_sample": False, "failure_kind": None, "failure_reason": None,
                **common,
            }  # fmt: skip
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            infos[agent].append({"_ng_task_index": t, "_ng_rollout_index": r, "reward": reward,
                                 "input_tokens": usage[0], "output_tokens": usage[1],
                                 "total_tokens": usage[0] + usage[1]})  # fmt: skip
    entries = [aggregate(a, env[a], infos[a], repeats) for a in agents if infos[a]]
    stem.with_name(stem.name + "_aggregate_metrics.json").write_text(json.dumps(entries, indent=2))
    return rollouts_fpath
