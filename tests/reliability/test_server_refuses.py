"""Issue 42 (3): a server that refuses. A real ``mlflow server`` behind a proxy on 127.0.0.1 that
answers 4xx (MLflow's JSON error document, or a reverse proxy's HTML page) for one endpoint: the
export ends FAILED at once, its reason naming what the server said, never after polling until
the export deadline ("the server did not answer in time"), and no receipt claims it.

The deadline here is the default's order (minutes): a test that polled would run into its bound,
and one that ends in a deadline message fails on the reason."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from gym_artifacts.run.artifacts import RunArtifacts
from tests.conftest import copy_quickstart
from tests.reliability.faulty_servers import REFUSAL_MARKER, RefusingProxy, proxy, refusal_body

pytest.importorskip("mlflow")

# The export's own deadline (minutes, as by default): a refusal must end the export long before.
DEADLINE_S = 120.0
# The endpoints a post-run export calls, each a place a server (or its proxy) may refuse.
ENDPOINTS = [
    "/mlflow/runs/create", "/mlflow/runs/search", "/mlflow/runs/log-batch", "/mlflow/runs/get",
    "/mlflow/runs/update", "/mlflow/experiments/get-by-name", "/mlflow-artifacts/artifacts/",
    "/mlflow/runs/log-inputs",
]  # fmt: skip
STATUSES = [400, 401, 403, 404, 409, 422]


def export_through(server_uri: str, endpoint: str, status: int, body: str) -> tuple[object, RefusingProxy, Path]:
    """One export of a fresh quickstart copy into a fresh experiment, through a proxy refusing
    ``endpoint`` with ``status``; returns (the mlflow result, the proxy, the run)."""
    root = Path(tempfile.mkdtemp(prefix="refused-"))
    try:
        run = copy_quickstart(root / "runs")
        policy = RefusingProxy(server_uri, endpoint, status, refusal_body(status, body))
        with proxy(policy) as uri:
            cfg = {"exporters": {"mlflow": {
                "enabled": True, "tracking_uri": uri, "experiment_name": f"refused-{uuid.uuid4().hex}",
                "export_deadline": DEADLINE_S, "report": "off",
            }}}  # fmt: skip
            [result] = export_run(run, cfg, exporters=["mlflow"])
        receipt = RunArtifacts.from_path(run).export_done_fpath("mlflow").exists()
        assert not receipt or result.status is ExportStatus.EXPORTED
        return result, policy, run
    finally:
        shutil.rmtree(root, ignore_errors=True)


def assert_refused_at_once(result: object, policy: RefusingProxy, status: int) -> None:
    assert result.status is ExportStatus.FAILED, (result, policy)  # type: ignore[attr-defined]
    reason = result.reason or ""  # type: ignore[attr-defined]
    assert "deadline" not in reason and "did not answer" not in reason, reason
    assert REFUSAL_MARKER in reason or str(status) in reason, reason
    assert "\n" not in reason


def test_runs_create_refused_with_403_fails_at_once_naming_the_refusal(mlflow_server: object) -> None:
    """The issue's case: runs/create answered 403 PERMISSION_DENIED."""
    started = time.monotonic()
    result, policy, _ = export_through(mlflow_server.uri, "/mlflow/runs/create", 403, "json")  # type: ignore[attr-defined]
    assert policy.refused >= 1
    assert_refused_at_once(result, policy, 403)
    assert "PERMISSION_DENIED" in result.reason  # type: ignore[attr-defined]
    assert time.monotonic() - started < DEADLINE_S / 3  # far from the deadline (no polling)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    status=st.sampled_from(STATUSES),
    body=st.sampled_from(["json", "html"]),
)
@example(endpoint="/mlflow/runs/create", status=401, body="html")
@example(endpoint="/mlflow-artifacts/artifacts/", status=403, body="json")
def test_any_refusal_ends_the_export_at_once_with_the_servers_words(
    mlflow_server: object, endpoint: str, status: int, body: str
) -> None:
    """Whatever endpoint a server refuses with whatever 4xx (other than 408 and 429, which ask
    to wait), the export is FAILED with the server's words, without waiting for a deadline."""
    result, policy, _ = export_through(mlflow_server.uri, endpoint, status, body)  # type: ignore[attr-defined]
    if policy.refused == 0:  # an endpoint this export had no need of (its result is then normal)
        assert result.status is ExportStatus.EXPORTED, result  # type: ignore[attr-defined]
        return
    assert_refused_at_once(result, policy, status)


LANGSMITH_ENDPOINTS = ["/datasets", "/sessions", "/runs/batch", "/runs/multipart", "/examples", "/feedback"]


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    endpoint=st.sampled_from(LANGSMITH_ENDPOINTS),
    status=st.sampled_from(STATUSES),
    body=st.sampled_from(["json", "html"]),
    method=st.sampled_from([None, "GET", "POST"]),
)
@example(endpoint="/runs/batch", status=403, body="json", method=None)
def test_langsmith_refusals_end_the_export_at_once(endpoint: str, status: int, body: str, method: str | None) -> None:
    """The same for LangSmith (the real client, against tests/langsmith_api.py behind the proxy):
    FAILED naming the refusal, or EXPORTED where the client treats the answer as "not there yet"
    and creates what it looked for; never a deadline."""
    pytest.importorskip("langsmith")
    from tests.langsmith_api import LangsmithApi

    root = Path(tempfile.mkdtemp(prefix="refused-ls-"))
    api = LangsmithApi().start()
    try:
        run = copy_quickstart(root / "runs")
        policy = RefusingProxy(api.url, endpoint, status, refusal_body(status, body), method=method)
        with proxy(policy) as uri:
            cfg = {"exporters": {"langsmith": {
                "enabled": True, "api_url": uri, "api_key": "lsv2_pt_refusal-test-0d93", "export_deadline": DEADLINE_S,
                "request_timeout": 10,
            }}}  # fmt: skip
            [result] = export_run(run, cfg, exporters=["langsmith"])
        if result.status is not ExportStatus.FAILED:
            assert result.status is ExportStatus.EXPORTED, result
            return
        assert policy.refused >= 1
        assert_refused_at_once(result, policy, status)
    finally:
        api.stop()
        shutil.rmtree(root, ignore_errors=True)
