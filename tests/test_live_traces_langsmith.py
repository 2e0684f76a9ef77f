"""Live traces in LangSmith (no LangSmith server runs outside its cloud: the real ``langsmith``
client against ``tests/langsmith_api.py``): rollouts handed to ``export_rollouts`` during a live
run appear as runs while the eval runs, a rate limit (HTTP 429) is waited out on the backend's
worker (the client's own Retry-After wait, then ``LiveTraces``' backoff), and
the export that completes the live experiment leaves every rollout once, its feedback once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langsmith")

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.live.fanout import live_run
from tests.langsmith_api import LangsmithApi
from tests.test_live_traces import ROLLOUTS, nemo_gym_rollouts, write_aggregate

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*deprecated and will be removed after")]
API_KEY = "lsv2-live-traces-key-0000000000000000"


def roots(api: LangsmithApi) -> list[dict[str, Any]]:
    with api.state.lock:
        return [r for r in api.state.runs.values() if not r.get("parent_run_id")]


def test_langsmith_live_runs_grow_back_off_a_rate_limit_and_the_export_adds_none(tmp_path: Path) -> None:
    api = LangsmithApi().start()
    try:
        api.state.throttle_runs = 6  # more than the client's own retries of one batch
        out = tmp_path / "eval.jsonl"
        records = nemo_gym_rollouts(ROLLOUTS)
        cfg = {"exporters": {"langsmith": {"enabled": True, "api_url": api.url, "api_key": API_KEY}}}
        seen = []
        with live_run(cfg, out, teardown_timeout=30.0, teardown_hard_cap=120.0) as live:
            with open(out, "ab") as fh:
                for i, record in enumerate(records):
                    fh.write(json.dumps(record).encode() + b"\n")
                    live.export_rollouts([record])
                    if i % 50 == 49:
                        seen.append(len(roots(api)))
                    time.sleep(0.05)
            live.flush(60)
        [report] = live.reports
        assert report.lost == 0, report.describe()
        assert seen == sorted(seen) and seen[-1] > seen[0], seen  # runs grew while the eval ran
        assert len(roots(api)) == ROLLOUTS
        traces = report.traces
        assert traces is not None and traces.sent == ROLLOUTS, report.describe()
        assert api.state.throttle_runs == 0  # the 429s were answered, waited out (Retry-After), sent again
        write_aggregate(out)
        [result] = export_run(out, cfg)
        assert result.status is ExportStatus.EXPORTED, result.reason
        assert len(api.state.sessions) == 1 and len(api.state.datasets) == 1  # one experiment
        root_ids = [r["id"] for r in roots(api)]
        assert len(root_ids) == len(set(root_ids)) == ROLLOUTS
        rewards = [f for f in api.state.feedback.values() if f["key"] == "reward"]
        assert len(rewards) == len({f["run_id"] for f in rewards}) == ROLLOUTS
    finally:
        api.stop()
