"""MLflow's own web UI, as a NeMo Gym user opens it after an export (a real ``mlflow server``,
Debian's chromium driven by Playwright): the Traces tab, one trace's span tree, the Overview's
Tool calls tab, the run's dataset and the Datasets page, each checked for the counts it shows and saved to
``test-artifacts/``."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.test_mlflow_traces import fixture_run, traces_cfg
from tests.test_report import (
    SCREENSHOTS,
    browser,  # noqa: F401 - the shared Chromium fixture
)

UI_WAIT_S = 60.0  # a loaded 2-core machine renders MLflow's pages slowly: a wait, not a cost


def page_text(page: Any, needle: str) -> str:
    """The page's text once it shows ``needle`` (MLflow's pages load their data after the shell)."""
    deadline = time.monotonic() + UI_WAIT_S
    while True:
        for button in page.get_by_role("button", name="Got it").all():  # first-visit hints
            button.click(timeout=2000)
        text = str(page.inner_text("body"))
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


# MLflow opens its Assistant side panel on a first visit (it covers a third of every page): the
# browser starts as one that has closed it before.
NO_ASSISTANT = """
localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
"""


@pytest.mark.slow
def test_mlflow_ui_shows_every_rollout_span_tree_tool_calls_and_dataset(
    mlflow_server: Any, browser: Any, tmp_path: Path  # noqa: F811
) -> None:
    rollouts = fixture_run(tmp_path)
    experiment = f"ui-{uuid.uuid4().hex[:8]}"
    [result] = export_run(rollouts, traces_cfg(mlflow_server.uri, experiment))
    assert result.status is ExportStatus.EXPORTED, result.reason
    experiment_id = MlflowClient(mlflow_server.uri).get_experiment_by_name(experiment).experiment_id
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    calls = sum(1 for r in records for i in r["response"]["output"] if i["type"] == "function_call")
    tokens = sum(r["response"]["usage"]["total_tokens"] for r in records)
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    page.add_init_script(NO_ASSISTANT)
    base = f"{mlflow_server.uri}/#/experiments/{experiment_id}"

    # the Traces tab: all 10 planned rollouts, the 2 failed ones as errors with their message (all
    # time: the fixture's rollouts are dated 2026-12-01, outside MLflow's default last 7 days later)
    page.goto(f"{base}/traces?startTimeLabel=ALL")
    text = page_text(page, "10 of 10")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-traces.png"))
    assert "10 of 10" in text
    assert text.count("Error\n") == 2 and text.count("ClientResponseError: 500") == 2

    # one trace's detail: the agent's span tree, the tool call and the model's token count
    page.get_by_text("what's it like in sf?").first.click()
    text = page_text(page, "get_weather")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-trace-detail.png"))
    assert "get_weather" in text and "fake-model" in text and "96 tokens" in text
    assert "San Francisco" in text  # the tool call's argument

    # the Overview's Tool calls tab: every function call of the Responses
    page.goto(f"{base}/overview/tool-calls")
    text = page_text(page, f"get_weather\n{calls}\n")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-tool-calls.png"))
    assert f"{calls}\nTotal Tool Calls" in text and f"get_weather\n{calls}\n" in text

    # the Overview's usage: token totals from the Responses' usage, the errors counted
    page.goto(f"{base}/overview/usage?startTimeLabel=ALL")
    text = page_text(page, "Token Usage")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-overview-usage.png"))
    assert f"{tokens} (" in text and "2 (Overall error rate: 20.0%)" in text

    # the runs list: the planned inputs as the run's dataset (10 rows)
    page.goto(f"{base}/runs")
    text = page_text(page, "planned inputs")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-run-dataset.png"))
    assert "planned inputs" in text

    # the Datasets page: the planned inputs as an evaluation dataset of 10 records
    page.goto(f"{base}/datasets")
    page_text(page, "planned inputs")
    page.get_by_text("planned inputs").first.click()
    text = page_text(page, "10 records")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-datasets.png"))
    assert "10 records" in text and text.count('{"responses_create_params"') == 10

    # the run's page: the headline as its description, and of the exporter's bookkeeping one
    # tag only (gym_artifacts, a JSON object), none of the old one-per-fact tags
    page.goto(f"{base}/runs/{result.backend_run_id}")
    text = page_text(page, "Tags")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-run-overview.png"), full_page=True)
    assert "8 of 10 planned rollouts scored (2 failed)" in text
    assert "gym_artifacts" in text and "gym_artifacts." not in text, text
    page.close()


@pytest.mark.slow
def test_mlflow_ui_short_runs_list_tools_panel_and_measured_spans(
    mlflow_server: Any, browser: Any, tmp_path: Path  # noqa: F811
) -> None:
    """Issue 39 in MLflow's own UI: the runs list carries the headline metrics only (at most 12),
    a model-call span shows MLflow's Tools panel, and NeMo Gym's observability run (its real
    fixture) has measured spans with tokens on every model call."""

    client = MlflowClient(mlflow_server.uri)
    experiment = f"ui39-{uuid.uuid4().hex[:8]}"
    [result] = export_run(fixture_run(tmp_path), traces_cfg(mlflow_server.uri, experiment))
    assert result.status is ExportStatus.EXPORTED, result.reason
    observability = fixture_run(tmp_path, "observability")
    [observed] = export_run(observability, traces_cfg(mlflow_server.uri, experiment))
    assert observed.status is ExportStatus.EXPORTED, observed.reason
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    metrics = client.get_run(result.backend_run_id).data.metrics
    assert len(metrics) <= 12
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1600, "height": 950})
    page.add_init_script(NO_ASSISTANT)
    base = f"{mlflow_server.uri}/#/experiments/{experiment_id}"

    # the evaluation-runs list: the headline metrics, none of the statistics left to
    # tables/metrics.json (before: 62 columns, every one headed "example_si...")
    page.goto(f"{base}/runs")
    page_text(page, "Evaluation runs")
    page.get_by_text("Evaluation runs").first.click()
    text = page_text(page, "coverage")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-evaluation-runs.png"))
    assert "coverage" in text and "ci_high_95" not in text and "max_across_repeats" not in text

    # a model-call span: MLflow's Tools panel lists the tool offered
    page.goto(f"{base}/traces?startTimeLabel=ALL")
    page_text(page, "what's it like in sf?")
    page.get_by_text("what's it like in sf?").first.click()
    text = page_text(page, "get_weather")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-trace-tree.png"))
    model = "stub-model" if "stub-model" in text else "fake-model"  # the observability run's, or not
    in_tree = [m for m in page.get_by_text(model, exact=True).all() if (m.bounding_box() or {}).get("x", 1e9) < 470]
    in_tree[0].click()
    text = page_text(page, "Tools\n(")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-tools-panel.png"))
    assert "Tools\n(1)" in text and "get_weather" in text  # MLflow's Tools panel, 1 tool

    # the observability run: every span measured, tokens on every model call
    traces = [t for t in client.search_traces(locations=[experiment_id], run_id=observed.backend_run_id,
                                              max_results=100, include_spans=True)]  # fmt: skip
    assert len(traces) == 10
    for trace in traces:
        assert all(s.end_time_ns > s.start_time_ns for s in trace.data.spans)
        models = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        assert models and all(s.attributes.get("mlflow.chat.tokenUsage") for s in models)
    # ... and on the page: one of its traces with a tool call (opened by id), each span's duration
    # and each model call's tokens as MLflow's span tree shows them
    tool_trace = next(t for t in traces if any(s.span_type == "TOOL" for s in t.data.spans))
    page.goto(f"{base}/traces?startTimeLabel=ALL&selectedEvaluationId={tool_trace.info.trace_id}")
    text = page_text(page, "get_weather\n")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-observability-trace.png"))
    models = re.findall(r"stub-model\n([\d.]+)(ms|s)\n(\d+)\n", text)
    tools = re.findall(r"get_weather\n([\d.]+)(ms|s)\n", text)
    assert len(models) == 2 and len(tools) == 1, text  # model call, tool, model call
    assert all(float(d) > 0 for d, _, _ in models + [(*t, "") for t in tools])  # measured spans
    assert all(int(tokens) > 0 for _, _, tokens in models)  # tokens on every model call
    page.close()


def aged(rollouts: Path, days: float) -> Path:
    """The run as if it ran ``days`` ago: every Response's ``created_at`` (the only time the
    with-failures fixture has) moved back by the same amount, nothing else changed."""
    shift = days * 86400
    lines = []
    for line in rollouts.read_text().splitlines():
        record = json.loads(line)
        record["response"]["created_at"] = record["response"]["created_at"] - shift
        lines.append(json.dumps(record) + "\n")
    rollouts.write_text("".join(lines))
    return rollouts


@pytest.mark.slow
def test_mlflow_ui_finds_the_traces_of_an_eval_older_than_a_week(
    mlflow_server: Any, browser: Any, tmp_path: Path  # noqa: F811
) -> None:
    """MLflow's experiment Traces view shows the last 7 days unless its URL names a range (MLflow
    3.17's ``startTimeLabel``): an eval that ran 20 days ago, its traces at their real times, is
    "Traces 0" and MLflow's onboarding page there. The run's description links the Traces view
    over the eval's own window, where every rollout is, and the export's result says so."""
    rollouts = aged(fixture_run(tmp_path), 20)
    experiment = f"old-{uuid.uuid4().hex[:8]}"
    [result] = export_run(rollouts, traces_cfg(mlflow_server.uri, experiment))
    assert result.status is ExportStatus.EXPORTED, result.reason
    experiment_id = MlflowClient(mlflow_server.uri).get_experiment_by_name(experiment).experiment_id
    assert result.reason is not None and "Last 7 days" in result.reason, result.reason
    assert f"#/experiments/{experiment_id}/traces?startTimeLabel=CUSTOM" in result.reason
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    page.add_init_script(NO_ASSISTANT)
    base = f"{mlflow_server.uri}/#/experiments/{experiment_id}"

    # MLflow's default Traces view: the last 7 days, none of this eval's traces (why the link)
    page.goto(f"{base}/traces")
    text = page_text(page, "Last 7 days")
    page.screenshot(path=str(SCREENSHOTS / "mlflow-old-eval-default-view.png"))
    assert "Last 7 days" in text and "10 of 10" not in text

    # the run's description: a link to the Traces view over the eval's window, all 10 there
    page.goto(f"{base}/runs/{result.backend_run_id}")
    page_text(page, "10 traces")
    with page.expect_popup() as opened:  # MLflow opens a description's links in a new tab
        page.get_by_role("link", name="10 traces").first.click()
    traces = opened.value
    text = page_text(traces, "10 of 10")
    traces.screenshot(path=str(SCREENSHOTS / "mlflow-old-eval-traces.png"))
    assert "10 of 10" in text  # every planned rollout, in the eval's own window
    assert text.count("Error\n") == 2
    traces.close()
    page.close()
