"""The README's live-logging example, runnable: a toy eval logged live, then exported once.

    python examples/live_eval.py [CONFIG.yaml] [OUT.jsonl]
    gym-artifacts export results/eval.jsonl

CONFIG.yaml chooses the backends (default: the local folder ``store/`` and MLflow in
``sqlite:///mlflow.db``). The eval writes what an export needs beside the rollouts file:

* ``OUT.jsonl``: the rollouts, one JSON object per line (here the same records it logs live);
* ``OUT_aggregate_metrics.json``: the aggregate metrics, a JSON list with one object per agent.
  The smallest valid file is ``[{}]`` written after the rollouts; this example writes
  ``[{"agent_ref": {"name": "toy_agent"}, "agent_metrics": {"mean/reward": <mean>}}]``, whose
  ``mean/reward`` ties it to the rollouts whatever the files' times say.

The export then completes each live backend run (``live.complete()``): one backend run per
destination. Writing the aggregate after the ``with`` block works too: the export sees that the
journal and rollouts are what the live run logged.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from gym_artifacts.core.config import load_yaml_config
from gym_artifacts.live import live_run

DEFAULT_CONFIG: dict[str, Any] = {
    "exporters": {
        "local": {"enabled": True, "root": "store"},
        "mlflow": {"enabled": True, "tracking_uri": "sqlite:///mlflow.db", "experiment_name": "live-eval"},
    }
}
AGENT = "toy_agent"


def toy_batches(n_batches: int = 5, per_batch: int = 4) -> list[list[dict[str, Any]]]:
    """Finished rollouts, batch by batch, in NeMo Gym's shape (agent, task, repeat, reward)."""
    rng = random.Random(0)
    return [
        [
            {
                "agent_ref": {"name": AGENT},
                "_ng_task_index": b * per_batch + i,
                "_ng_rollout_index": 0,
                "reward": float(rng.random() < 0.5),
            }
            for i in range(per_batch)
        ]
        for b in range(n_batches)
    ]


def write_aggregate(out: Path, rollouts: list[dict[str, Any]]) -> None:
    """``OUT_aggregate_metrics.json``: one entry per agent, its mean reward over the rollouts."""
    mean = sum(r["reward"] for r in rollouts) / len(rollouts)
    entry = {"agent_ref": {"name": AGENT}, "agent_metrics": {"mean/reward": mean}}
    out.with_name(f"{out.stem}_aggregate_metrics.json").write_text(json.dumps([entry]))


def main(config: Any = None, out: Path = Path("results/eval.jsonl")) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    config = DEFAULT_CONFIG if config is None else config
    batches = toy_batches()
    written: list[dict[str, Any]] = []
    with live_run(config, out) as live, open(out, "w") as rollouts_file:
        for step, finished in enumerate(batches):
            r = sum(x["reward"] for x in finished) / len(finished)
            l = 1.0 / (step + 1)  # noqa: E741 (the README's names)
            live.export_metrics({"reward": r, "loss": l}, step=step)  # microseconds, never raises
            live.export_rollouts(finished)  # the eval still writes OUT.jsonl
            rollouts_file.writelines(json.dumps(x) + "\n" for x in finished)
            written.extend(finished)
        rollouts_file.flush()
        write_aggregate(out, written)
        live.complete()  # the eval finished: see --complete-live-run


if __name__ == "__main__":
    cfg = load_yaml_config(sys.argv[1]) if len(sys.argv) > 1 else None
    main(cfg, Path(sys.argv[2]) if len(sys.argv) > 2 else Path("results/eval.jsonl"))
