"""LangSmith's workspace id reaches the server: NeMo Gym's ``langsmith_workspace_id`` (and this
project's ``exporters.langsmith.workspace_id``) is sent as LangSmith's workspace header
(``X-Tenant-Id``) on every request, live and post-run; a different workspace is a different
destination. The real ``langsmith`` client against the local LangSmith API (tests/langsmith_api.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from gym_artifacts import nemo_gym
from gym_artifacts._builtin_exporters.langsmith import LangsmithExporter, LangsmithSettings
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.langsmith_api import LangsmithApi

WORKSPACE = "3f0b7a52-6a8e-4d2c-9a54-2f1c6a0d9e11"
KEY = "lsv2_pt_workspace_0123456789"


def test_nemo_gyms_workspace_id_is_every_live_requests_workspace(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in (NEMO_GYM_FIXTURES / "clean" / "rollouts.jsonl").read_text().splitlines()[:2]]
    out = tmp_path / "rollouts.jsonl"
    api = LangsmithApi().start()
    try:
        config = {
            "output_jsonl_fpath": str(out),
            "langsmith_api_key": KEY,
            "langsmith_endpoint": api.url,
            "langsmith_dataset_name": "ng-tasks",
            "langsmith_experiment_name": "ng-experiment",
            "langsmith_workspace_id": WORKSPACE,
        }
        assert [e.name for e in nemo_gym.setup_exporters(config)] == ["langsmith"]
        nemo_gym.export_rollouts(rows)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        nemo_gym.teardown_exporters()
        requests = list(api.state.requests)
    finally:
        nemo_gym.teardown_exporters()
        api.stop()
    assert requests
    assert {r.headers.get("X-Tenant-Id") for r in requests} == {WORKSPACE}


def test_the_workspace_is_part_of_the_destination() -> None:
    base = {"api_url": "http://127.0.0.1:1", "dataset_name": "d", "experiment_name": "e"}
    one = LangsmithExporter.destination_for(LangsmithSettings.model_validate({**base, "workspace_id": WORKSPACE}))
    other = LangsmithExporter.destination_for(LangsmithSettings.model_validate(base))
    assert one != other and one["workspace_id"] == WORKSPACE
