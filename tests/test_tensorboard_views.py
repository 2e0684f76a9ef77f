"""What TensorBoard shows of a NeMo Gym run (issue 39), read back from the real event files:
per-rollout values over the rollouts' completion order, Distributions with more than one step
(a one-step histogram draws as a blank chart), a rollouts table with every planned rollout
(failed ones too), its tool calls and tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    HISTOGRAMS,
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from gym_artifacts import export_run
from gym_artifacts.contract.hooks import ExportStatus
from tests.test_mlflow_traces import fixture_run
from tests.test_report import browser  # noqa: F401 - the shared Chromium fixture


def test_tensorboard_shows_each_rollout_distributions_and_a_full_table(tmp_path: Path) -> None:
    rollouts = fixture_run(tmp_path)
    cfg = OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}}})
    [result] = export_run(rollouts, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    acc = EventAccumulator(str(tmp_path / "tb" / result.backend_run_id),
                           size_guidance={TENSORS: 0, HISTOGRAMS: 0, SCALARS: 0})  # fmt: skip
    acc.Reload()
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    # each rollout's reward at its index in completion order (OUT.jsonl's line order)
    rewards = acc.Scalars("rollout/reward")
    assert [(e.step, e.value) for e in rewards] == [(i, r["reward"]) for i, r in enumerate(records)]
    assert [e.step for e in acc.Scalars("rollout/total_tokens")] == list(range(len(records)))
    # Distributions: each histogram at more than one step
    tags = acc.Tags()["histograms"]
    assert "rollouts/reward" in tags
    assert all(len({e.step for e in acc.Histograms(t)}) > 1 for t in tags)
    # the table: 10 planned rollouts, the 2 failed ones with their failure, tool calls and tokens
    chunks = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("rollouts/table")]
    header = chunks[0].splitlines()[0]
    assert all(c in header for c in ("prompt", "answer", "tool_calls", "total_tokens", "reward", "failure"))
    rows = [line for chunk in chunks for line in chunk.splitlines()[2:]]
    assert len(rows) == 10
    assert sum("ClientResponseError" in row for row in rows) == 2
    assert any("get_weather(" in row for row in rows) and any("| 96 |" in row for row in rows)


@pytest.mark.slow
def test_tensorboard_ui_draws_distributions_and_the_rollouts_table(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """TensorBoard's own UI (``tensorboard --logdir``, Chromium): the Distributions tab draws a
    chart with data, the Text tab shows the failed rollouts; screenshots in test-artifacts/."""
    import os
    import re
    import sys
    import time

    from tests.server_process import free_port, kill_process_group, start_process_group
    from tests.test_report import SCREENSHOTS

    rollouts = fixture_run(tmp_path)
    cfg = OmegaConf.create({"exporters": {"tensorboard": {"enabled": True, "logdir": str(tmp_path / "tb")}}})
    [result] = export_run(rollouts, cfg)
    assert result.status is ExportStatus.EXPORTED, result.reason
    port = free_port()
    binary = str(Path(sys.executable).with_name("tensorboard"))
    proc = start_process_group(
        [binary, "--logdir", str(tmp_path / "tb"), "--host", "127.0.0.1", "--port", str(port)],
        dict(os.environ), tmp_path / "tensorboard.log", f"http://127.0.0.1:{port}/data/logdir", 120,
    )  # fmt: skip
    try:
        SCREENSHOTS.mkdir(exist_ok=True)
        page = browser.new_page(viewport={"width": 1500, "height": 950})

        def shown(selector: str) -> int:
            deadline = time.monotonic() + 60
            while page.locator(selector).count() == 0 and time.monotonic() < deadline:
                time.sleep(0.5)
            return int(page.locator(selector).count())

        page.goto(f"http://127.0.0.1:{port}/?darkMode=false#distributions")
        charts = shown("tf-histogram-chart, vz-histogram-timeseries, svg path.area, svg .area")
        time.sleep(2)
        page.screenshot(path=str(SCREENSHOTS / "tensorboard-distributions.png"))
        assert charts > 0
        page.get_by_text(re.compile(r"^\s*text\s*$", re.IGNORECASE)).first.click()
        group = page.locator('span.category-name[title="rollouts"] >> visible=true').first
        group.click(timeout=90_000)  # open the group
        failed = page.get_by_text(re.compile("ClientResponseError"))
        tools = page.get_by_text(re.compile(r"get_weather\("))
        deadline = time.monotonic() + 90
        while failed.count() < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        page.screenshot(path=str(SCREENSHOTS / "tensorboard-rollouts-table.png"))
        assert failed.count() >= 2 and tools.count() >= 1  # the failed rollouts, the tool calls
        page.close()
    finally:
        kill_process_group(proc)
