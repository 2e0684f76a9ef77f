"""A driver that live-logs from Ray actors through ``live.handle()`` (used by a test and a benchmark).

``python tests/ray_live_driver.py '[ADDRESS, OUT.jsonl, CONFIG, ACTORS, CALLS]'``: ACTORS actors,
spread over the cluster's nodes, each make CALLS ``export_metrics`` calls (key ``actor<i>/x``,
steps 0..CALLS-1) and one ``export_rollouts`` call, timing each call, then flush. Prints one JSON
object: per actor the call costs (ns), whether the flush was confirmed, its process and node;
and the live run's teardown reports.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray

from gym_artifacts.live import live_run


@ray.remote(num_cpus=0, scheduling_strategy="SPREAD")
class Worker:
    def __init__(self, live: object) -> None:
        self.live = live  # the handle, unpickled in this actor's process

    def work(self, i: int, n: int) -> dict[str, object]:
        costs = []
        for j in range(n):
            t = time.perf_counter_ns()
            self.live.export_metrics({f"actor{i}/x": float(j)}, step=j)
            costs.append(time.perf_counter_ns() - t)
        self.live.export_rollouts([{"actor": i, "reward": 1.0}])
        return {
            "costs": costs,
            "flushed": self.live.flush(120),
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "dropped": self.live.stats().dropped,
        }


def main() -> None:
    address, out, cfg, actors, calls = json.loads(sys.argv[1])
    ray.init(address=address, logging_level="ERROR")
    with live_run(cfg, out) as live:
        handle = live.handle()
        workers = [Worker.remote(handle) for _ in range(actors)]
        done = ray.get([w.work.remote(i, calls) for i, w in enumerate(workers)], timeout=600)
        live.flush(120)
    print(json.dumps({
        "workers": done,
        "reports": [r.describe() for r in live.reports],
        "lost": [r.lost for r in live.reports],
        "journal_lost": live.journal_lost,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
