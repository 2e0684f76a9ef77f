"""A small synthetic eval run, unique per call, for the contract suite (no repository files needed)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

ROLLOUTS = 12
SECRET_CANARY = "canary-" + "a1b2c3d4e5f6a7b8"  # a value no backend may store, in the run's config


def run_config(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The eval's config: one backend enabled with ``settings``, plus a secret it must never store."""
    return {
        "policy_model_name": "contract-policy",
        "policy_api_key": SECRET_CANARY,
        "num_repeats": 2,
        "exporters": {name: {"enabled": True, **settings}},
    }


def rollouts(nonce: str, start: int = 0, count: int = ROLLOUTS) -> list[dict[str, Any]]:
    """Records shaped like NeMo Gym's, tagged with ``nonce`` so every sample run is a new run."""
    return [
        {
            "task_index": i // 2,
            "repeat": i % 2,
            "agent_ref": {"name": "contract_agent"},
            "response": {"output_text": f"answer {i} of run {nonce}", "nonce": nonce},
            "reward": float(i % 2),
        }
        for i in range(start, start + count)
    ]


def write_aggregate(out: Path, records: list[dict[str, Any]]) -> None:
    """The aggregate metrics file the eval writes last (newer than the rollouts, agreeing with them)."""
    mean = sum(r["reward"] for r in records) / len(records)
    aggregate = [
        {
            "agent_ref": {"name": "contract_agent"},
            "agent_metrics": {"mean/reward": mean, "num_rollouts": len(records)},
        }
    ]
    fpath = out.with_name(f"{out.stem}_aggregate_metrics.json")
    fpath.write_text(json.dumps(aggregate))
    later = time.time() + 1
    os.utime(fpath, (later, later))


def write_rollouts(out: Path, records: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records))


def make_run(folder: Path, name: str, settings: dict[str, Any]) -> tuple[Path, list[dict[str, Any]]]:
    """A finished run under ``folder``: rollouts, aggregate metrics, saved config, one artifact."""
    import yaml

    out = folder / "eval.jsonl"
    records = rollouts(uuid.uuid4().hex)
    write_rollouts(out, records)
    out.with_name("eval_config.yaml").write_text(yaml.safe_dump(run_config(name, settings)))
    artifacts = out.with_name("eval_artifacts")
    artifacts.mkdir()
    (artifacts / "session_times.json").write_text('{"start": "2026-01-01T00:00:00+00:00", "duration_s": 1.0}')
    write_aggregate(out, records)
    return out, records
