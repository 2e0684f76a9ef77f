"""A token as a tracking URI's user part is never printed: every FAILED reason and
log line passes the same URI masking, whoever (our code or a backend's SDK) wrote it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gym_artifacts.core.secrets import mask_uri_credentials
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("token", ["shortTk9"])
def test_a_token_in_a_tracking_uris_user_part_is_never_printed(
    quickstart_run: Path, tmp_path: Path, token: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "5"
    proc = run_bounded(
        [sys.executable, "-m", "gym_artifacts.cli", "-v", "export", str(quickstart_run), "-e", "mlflow", "--json",
         f"exporters.mlflow.tracking_uri=http://{token}@127.0.0.1:9"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240,
    )  # fmt: skip
    [result] = json.loads(proc.stdout)
    assert result["status"] == "FAILED" and "***@127.0.0.1:9" in result["reason"], result
    assert token not in proc.stdout + proc.stderr


@pytest.mark.parametrize("user", ["git", "root", "ec2-user"])
def test_a_plain_user_name_in_a_uri_stays_visible(user: str) -> None:
    assert (
        mask_uri_credentials(f"ssh://{user}@github.com/org/repo.git")
        == f"ssh://{user}@github.com/org/repo.git"
    )
