"""Regenerate the quickstart run: a small eval in NeMo Gym 0.7's real output format.

    python examples/quickstart/make_run.py

What NeMo Gym 0.7 writes (see ``tests/nemo_gym_runs.py``): ``eval.jsonl`` (75 tasks x 4 repeats =
300 Responses API rollouts of 3 agents, in completion order), ``eval_aggregate_metrics.json``,
``eval_failures.jsonl`` (empty: nothing failed) and ``eval_materialized_inputs.jsonl`` (the 300
planned inputs). And this project's extras, which NeMo Gym does not write: ``eval_config.yaml``
(the config as saved, ``${oc.env:...}`` secret unresolved), ``eval_metrics.jsonl`` (a live
journal) and ``eval_artifacts/`` (session times, NVML summary, a gzip profiler trace, a
recording). Deterministic except the recording's encoder metadata.

Needs PyAV and numpy for the recording: ``pip install -e '.[recording,test]'`` (or ``pip install
av numpy``); without them it says so and stops before writing anything.
"""

from __future__ import annotations

import gzip
import json
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
from tests.nemo_gym_runs import write_run  # noqa: E402

TASKS = 75
REPEATS = 4
AGENTS = ("weather_simple_agent", "travel_simple_agent", "calendar_simple_agent")


CONFIG = """\
# The eval's config as this project's live layer saves it (NeMo Gym itself saves none):
# interpolations are kept as written.
policy_model_name: quickstart-policy
policy_base_url: http://127.0.0.1:8000/v1
policy_api_key: ${oc.env:POLICY_API_KEY,sk-quickstart-not-a-real-key}
num_repeats: 4
input_jsonl_fpath: resources_servers/example_single_tool_call/data/example.jsonl
max_tokens: 512
temperature: 0.7
output_jsonl_fpath: examples/quickstart/eval.jsonl
"""


def main() -> None:
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
    # Written last, as NeMo Gym does: aggregate metrics newer than the rollouts.
    write_run(HERE / "eval.jsonl", tasks=TASKS, repeats=REPEATS, agents=AGENTS)


if __name__ == "__main__":
    main()
