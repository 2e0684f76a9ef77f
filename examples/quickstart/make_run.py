"""Regenerate the quickstart run: a small but real NeMo Gym-style eval with runtime artifacts.

    python examples/quickstart/make_run.py

Writes ``eval.jsonl`` (300 rollouts), ``eval_aggregate_metrics.json`` (NeMo Gym format),
``eval_config.yaml`` (with an ``${oc.env:...}`` secret), ``eval_metrics.jsonl`` (a live journal)
and ``eval_artifacts/`` (session times, NVML summary, a gzip profiler trace, a recording).
Deterministic except the recording's encoder metadata.

Needs PyAV and numpy for the recording: ``pip install -e '.[recording,test]'`` (or ``pip install
av numpy``); without them it says so and stops before writing anything.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

try:
    import av  # noqa: F401
    import numpy  # noqa: F401
except ImportError as exc:  # say what is missing instead of a traceback from the middle of a run
    sys.exit(f"make_run.py needs PyAV and numpy for the recording ({exc}): pip install av numpy")

from tests.media import write_recording  # noqa: E402

ROLLOUTS = 300
TASKS = ["arithmetic", "weather", "retrieval"]


def rollout(i: int, rng: random.Random) -> dict:
    task = TASKS[i % len(TASKS)]
    reward = 1.0 if rng.random() < {"arithmetic": 0.8, "weather": 0.6, "retrieval": 0.45}[task] else 0.0
    return {
        "task_index": i // 4,
        "repeat": i % 4,
        "agent_ref": {"type": "responses_api_agents", "name": f"{task}_agent"},
        "responses_create_params": {
            "input": [{"role": "user", "content": f"[{task}] question #{i // 4}"}],
            "temperature": 0.7,
        },
        "response": {
            "output_text": f"answer {rng.randint(0, 999)}",
            "usage": {"input_tokens": rng.randint(20, 80), "output_tokens": rng.randint(5, 200)},
        },
        "reward": reward,
        "latency_s": round(rng.uniform(0.2, 3.0), 3),
    }


def aggregate(rows: list[dict]) -> list[dict]:
    entries = []
    for task in TASKS:
        mine = [r for r in rows if r["agent_ref"]["name"] == f"{task}_agent"]
        rewards = [r["reward"] for r in mine]
        by_task: dict[int, list[float]] = {}
        for r in mine:
            by_task.setdefault(r["task_index"], []).append(r["reward"])
        pass_at_1 = sum(rewards) / len(rewards)
        pass_at_4 = sum(1 for v in by_task.values() if max(v) > 0) / len(by_task)
        entries.append({
            "agent_ref": mine[0]["agent_ref"],
            "agent_metrics": {"mean/reward": pass_at_1, "num_rollouts": len(mine)},
            "key_metrics": {"pass@1": pass_at_1, "pass@4": pass_at_4},
            "group_level_metrics": [
                {"group": "short", "mean/reward": sum(rewards[: len(rewards) // 2]) / (len(rewards) // 2)},
                {"group": "long", "mean/reward": sum(rewards[len(rewards) // 2 :]) / (len(rewards) - len(rewards) // 2)},
            ],
            "repeat_level_metrics": {
                f"repeat_{k}": sum(r["reward"] for r in mine if r["repeat"] == k) / max(1, sum(1 for r in mine if r["repeat"] == k))
                for k in range(4)
            },
            "perf_summary": {"mean_latency_s": round(sum(r["latency_s"] for r in mine) / len(mine), 4)},
        })  # fmt: skip
    return entries


CONFIG = """\
# The eval's config as NeMo Gym saved it: interpolations are kept as written.
policy_model_name: quickstart-policy
policy_base_url: http://127.0.0.1:8000/v1
policy_api_key: ${oc.env:POLICY_API_KEY,sk-quickstart-not-a-real-key}
num_repeats: 4
max_tokens: 512
temperature: 0.7
output_jsonl_fpath: examples/quickstart/eval.jsonl
"""


def main() -> None:
    rng = random.Random(0)
    rows = [rollout(i, rng) for i in range(ROLLOUTS)]
    artifacts = HERE / "eval_artifacts"
    artifacts.mkdir(exist_ok=True)
    (HERE / "eval_config.yaml").write_text(CONFIG)
    with open(HERE / "eval_metrics.jsonl", "w") as fh:
        for step in range(20):
            metrics = {
                "train/reward": round(0.4 + step * 0.02, 4),
                "rollouts_done": (step + 1) * 15,
            }
            fh.write(json.dumps({"step": step, "time": 1764525600.0 + step * 3.5, "metrics": metrics}) + "\n")
    with open(HERE / "eval.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    (artifacts / "session_times.json").write_text(
        json.dumps({"start": "2026-11-30T18:00:00+00:00", "end": "2026-11-30T18:01:10+00:00"}, indent=2)
    )
    (artifacts / "metrics_summary.json").write_text(
        json.dumps({"samples": 0, "reason": "NVML unavailable: no NVIDIA driver on this machine"}, indent=2)
    )
    trace = {
        "traceEvents": [
            {"name": f"chunk_{i}", "ph": "X", "ts": i * 1000, "dur": 900, "pid": 1, "tid": 1}
            for i in range(1, 4)
        ]
    }
    with gzip.GzipFile(artifacts / "profile.pt.trace.json.gz", "wb", mtime=0) as gz:
        gz.write(json.dumps(trace).encode())
    write_recording(artifacts / "recording.mp4")
    # Written last, as an eval does: aggregate metrics newer than the rollouts.
    (HERE / "eval_aggregate_metrics.json").write_text(json.dumps(aggregate(rows), indent=2))


if __name__ == "__main__":
    main()
