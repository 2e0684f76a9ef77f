"""The HTML report, in real headless Chromium (Debian's chromium driven by Playwright)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from benchmarks.common import write_rollouts
from gym_artifacts import export_run
from gym_artifacts.cli import main
from gym_artifacts.report import build_report
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("GYM_ARTIFACTS_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "test-artifacts"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (scripts/test.sh installs Debian's chromium)")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


class Opened:
    def __init__(self, page: Any, errors: list[str], requests: list[str], seconds: float) -> None:
        self.page, self.errors, self.requests, self.seconds = page, errors, requests, seconds


def open_report(browser: Any, report: Path) -> Opened:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    started = time.monotonic()
    page.goto(report.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
    return Opened(page, errors, requests, time.monotonic() - started)


def test_quickstart_report(browser: Any, quickstart_run: Path, tmp_path: Path) -> None:
    report = build_report(quickstart_run, tmp_path / "report.html")
    opened = open_report(browser, report)
    page = opened.page
    assert opened.errors == []
    assert [r for r in opened.requests if not r.startswith(("file://", "data:"))] == []  # no network
    assert opened.requests[0] == report.as_uri()
    # every chart has drawn data
    charts = page.eval_on_selector_all(
        "div.chart",
        "els => els.map(e => ({n: +e.dataset.points, "
        "drawn: e.querySelectorAll('[id*=\"-series-\"] > path, [id*=\"-bar-\"] > path').length}))",
    )
    assert len(charts) >= 3 and all(c["n"] > 0 and c["drawn"] > 0 for c in charts), charts
    # the recording's metadata loads
    duration = page.evaluate(
        """() => new Promise(resolve => {
            const v = document.getElementById('recording-video');
            if (v.error) resolve(-v.error.code);
            if (v.readyState >= 1) resolve(v.duration);
            v.addEventListener('loadedmetadata', () => resolve(v.duration));
            v.addEventListener('error', () => resolve(-(v.error ? v.error.code : 99)));
            setTimeout(() => resolve(-100), 15000);
        })"""
    )
    assert duration > 0
    # searching the rollout table filters rows
    assert page.locator("#rollout-table tbody tr").count() == 50
    page.fill("#rollout-search", "travel_simple_agent")
    info = page.inner_text("#page-info")
    assert "(100 rows)" in info, info
    assert all("travel_simple_agent" in t for t in page.locator("#rollout-table tbody tr").all_inner_texts())
    page.fill("#rollout-search", "no-such-rollout-anywhere")
    assert page.locator("#rollout-table tbody tr").count() == 0
    page.fill("#rollout-search", "")
    page.click("#rollout-table th:nth-child(2)")  # sort by reward
    page.click("#rollout-table th:nth-child(2)")
    first_reward = page.locator("#rollout-table tbody tr").first.locator("td").nth(1).inner_text()
    assert float(first_reward) == 1.0
    # the summary masks secrets, names exports and identities
    text = page.inner_text("#summary")
    assert '"policy_api_key": "***"' in text and "rollouts.jsonl" in text
    assert "No GPU samples were recorded" in page.inner_text("#gpu")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "report-quickstart.png"), full_page=True)
    page.close()


NEMO_GYM = NEMO_GYM_FIXTURES


def table_cells(page: Any) -> tuple[list[str], list[dict[str, str]]]:
    """The rollout table's header and every row (all pages), as the browser drew them."""
    header = page.eval_on_selector_all("#rollout-table thead th", "ths => ths.map(t => t.innerText.trim())")
    rows: list[dict[str, str]] = []
    while True:
        cells = page.eval_on_selector_all(
            "#rollout-table tbody tr",
            "trs => trs.map(r => [...r.querySelectorAll('td')].map(td => td.innerText))",
        )
        rows.extend(dict(zip(header, c, strict=True)) for c in cells)
        info = page.inner_text("#page-info")
        page_no, pages = (int(x) for x in info.split("(")[0].replace("page", "").split("of"))
        if page_no >= pages:
            return header, rows
        page.click("#next-page")


@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_nemo_gym_report_shows_prompts_and_responses(browser: Any, name: str, tmp_path: Path) -> None:
    """Real NeMo Gym 0.7 output: each rollout's prompt (last user message) and response text
    (from the Response's output[] items), its tool call, and the failed rollouts with their reason."""
    src = NEMO_GYM / name
    run = tmp_path / name
    shutil.copytree(src, run)
    report = build_report(run / "rollouts.jsonl", tmp_path / f"{name}.html")
    opened = open_report(browser, report)
    assert opened.errors == []
    header, rows = table_cells(opened.page)
    assert header[:2] == ["line", "reward"]
    assert {"task", "repeat", "agent", "prompt", "response", "tool calls"} <= set(header)
    assert not any(h.startswith("_ng_") or h == "mask_sample" for h in header)
    source = [json.loads(x) for x in (src / "rollouts.jsonl").read_text().splitlines()]
    scored = [r for r in rows if not r["line"].startswith("failed")]
    assert len(scored) == len(source)
    for row, rollout in zip(sorted(scored, key=lambda r: int(r["line"])), source, strict=True):
        user = [m for m in rollout["responses_create_params"]["input"] if m["role"] == "user"][-1]
        texts = [
            p["text"]
            for item in rollout["response"]["output"]
            if item["type"] == "message"
            for p in item["content"]
        ]
        assert row["prompt"] == user["content"] and row["prompt"]
        assert row["response"] == "\n".join(texts) and row["response"]
        assert row["task"] == str(rollout["_ng_task_index"]) and row["repeat"] == str(
            rollout["_ng_rollout_index"]
        )
        assert float(row["reward"]) == rollout["reward"]
        calls = [i for i in rollout["response"]["output"] if i["type"] == "function_call"]
        assert row["tool calls"] == "; ".join(f"{c['name']}({c['arguments']})" for c in calls)
    failed = [r for r in rows if r["line"].startswith("failed")]
    coverage = opened.page.inner_text("#rollouts .coverage")
    if name == "clean":
        assert failed == [] and "10 of 10 planned rollouts scored" in coverage
    else:
        assert [(r["task"], r["failure"]) for r in failed] == [("4", "agent_run_error")] * 2
        assert all("Internal Server Error" in r["reason"] for r in failed)
        assert "8 of 10 planned rollouts scored (2 failed) - partial" in coverage
    assert "coverage" in opened.page.inner_text("#summary").lower()
    SCREENSHOTS.mkdir(exist_ok=True)
    opened.page.screenshot(path=str(SCREENSHOTS / f"report-nemo-gym-{name}.png"), full_page=True)
    opened.page.close()


def test_large_report_becomes_interactive(
    browser: Any, quickstart_run: Path, tmp_path: Path, record_property: Any
) -> None:
    write_rollouts(quickstart_run, 100_000, row_bytes=400)
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    started = time.monotonic()
    report = build_report(quickstart_run, tmp_path / "big.html")
    built = time.monotonic() - started
    opened = open_report(browser, report)
    ready_ms = opened.page.evaluate("window.__reportReadyMs")
    print(f"100,000-rollout report: built in {built:.2f} s, {report.stat().st_size / 1e6:.1f} MB, "
          f"interactive after {opened.seconds:.2f} s (page script ready at {ready_ms:.0f} ms)")  # fmt: skip
    record_property("report_100k_interactive_s", round(opened.seconds, 3))
    assert opened.errors == []
    assert "(100,000 rows)" in opened.page.inner_text("#page-info")
    assert report.stat().st_size < 8e6  # rows embedded compressed (the plain JSON form was 42 MB)
    opened.page.fill("#rollout-search", "99999")
    tasks = opened.page.eval_on_selector_all(
        "#rollout-table tbody tr", "rows => rows.map(r => r.querySelectorAll('td')[2].innerText)"
    )
    assert "99999" in tasks and len(tasks) < 20, tasks
    opened.page.close()


REPORT_MEMORY = """
import sys
from benchmarks.common import peak_rss_mb
from gym_artifacts.run.coverage import coverage_of
from gym_artifacts.report import build_report
from gym_artifacts.run.artifacts import RunArtifacts
run = RunArtifacts.from_path(sys.argv[1])
coverage = coverage_of(run, {})
base = peak_rss_mb()
build_report(run, sys.argv[2], identities={}, coverage=coverage, secrets=frozenset({"canary-f00d"}))
print(peak_rss_mb() - base)
"""


@pytest.mark.slow
def test_a_100k_rollout_report_is_built_in_bounded_memory(quickstart_run: Path, tmp_path: Path) -> None:
    """The table's rows are spooled, not held: 100,000 rollouts of 2 KB (every text cell cut at
    its limit) cost the report tens of MB, not hundreds; a secret inside a rollout is redacted
    in the compressed rows too."""
    import base64
    import gzip
    import re
    import sys

    write_rollouts(quickstart_run, 100_000, row_bytes=2000)
    with open(quickstart_run, "a") as fh:
        fh.write(json.dumps({"task_index": 7, "response": {"output_text": "key canary-f00d"}}) + "\n")
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    proc = run_bounded(
        [sys.executable, "-c", REPORT_MEMORY, str(quickstart_run), str(tmp_path / "big.html")],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown_mb = float(proc.stdout.split()[-1])
    assert grown_mb < 150, f"the report grew the process by {grown_mb:.0f} MB"
    page = (tmp_path / "big.html").read_text()
    [packed] = re.findall(r'id="rollout-data-gz">([^<]+)<', page)
    rows = json.loads(gzip.decompress(base64.b64decode(packed)))
    assert len(rows["rows"]) == 100_001
    assert "canary-f00d" not in json.dumps(rows) and "canary-f00d" not in page


def test_missing_pieces_are_said_plainly(browser: Any, quickstart_run: Path, tmp_path: Path) -> None:
    quickstart_run.unlink()
    shutil.rmtree(quickstart_run.with_name("eval_artifacts"))
    quickstart_run.with_name("eval_metrics.jsonl").unlink()
    report = build_report(quickstart_run, tmp_path / "sparse.html")
    opened = open_report(browser, report)
    page = opened.page
    assert opened.errors == []
    assert "No rollouts: the run has no rollouts file." in page.inner_text("#rollouts")
    assert "No recording in this run." in page.inner_text("#recording")
    assert "No GPU samples were recorded" in page.inner_text("#gpu")
    assert "No step metrics were logged live" in page.inner_text("#steps")
    assert page.locator("div.chart").count() == 0  # no empty charts
    page.close()


def test_gpu_series_are_drawn(browser: Any, quickstart_run: Path, tmp_path: Path) -> None:
    artifacts = quickstart_run.with_name("eval_artifacts")
    (artifacts / "metrics_summary.json").write_text(
        json.dumps({"samples": 3, "avg_vram_gb": 41.0, "peak_vram_gb": 42.0})
    )
    samples = [{"time": 100.0 + i, "gpu": g, "metrics": {"gpu_util_pct": 70 + i, "memory_used_gb": 40 + g, "power_w": 300}}
               for i in range(3) for g in (0, 1)]  # fmt: skip
    (artifacts / "nvml_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    opened = open_report(browser, build_report(quickstart_run, tmp_path / "gpu.html"))
    gpu = opened.page.inner_text("#gpu")
    assert "GPU 0" in gpu and "GPU 1" in gpu and "peak_vram_gb" in gpu
    assert opened.page.locator("#gpu div.chart").count() == 6
    opened.page.close()


@pytest.mark.slow
def test_local_backend_writes_the_report_and_cli_report(
    quickstart_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    [result] = export_run(
        quickstart_run, OmegaConf.create({"exporters": {"local": {"enabled": True, "root": str(store)}}})
    )
    page = (store / "default" / result.backend_run_id / "report.html").read_text()
    assert 'src="artifacts/recording.mp4"' in page and "<script" in page
    assert "http://" not in page.replace("http://127.0.0.1:8000", "") and "https://" not in page
    assert main(["report", str(quickstart_run), "-o", str(tmp_path / "r.html")]) == 0
    assert Path(capsys.readouterr().out.strip()) == tmp_path / "r.html"


def test_recording_plays_at_its_own_size(browser: Any, quickstart_run: Path, tmp_path: Path) -> None:
    from tests.media import write_dash_chunks

    chunks = write_dash_chunks(tmp_path / "rec", frames=10, fps=10, width=320, height=240)
    with open(quickstart_run.with_name("eval_artifacts") / "recording.mp4", "wb") as out:
        out.write((tmp_path / "rec" / "init.mp4").read_bytes())
        for chunk in chunks:
            out.write(chunk.read_bytes())
    opened = open_report(browser, build_report(quickstart_run, tmp_path / "rec.html"))
    size = opened.page.evaluate(
        """() => new Promise(resolve => {
            const v = document.getElementById('recording-video');
            const done = () => setTimeout(() => resolve([v.videoWidth, v.videoHeight, v.clientWidth, v.clientHeight]), 50);
            if (v.readyState >= 1) done(); else v.addEventListener('loadedmetadata', done);
            setTimeout(() => resolve(null), 15000);
        })"""
    )
    assert size == [320, 240, 320, 240]
    assert "320 x 240 px" in opened.page.inner_text("#recording")
    opened.page.close()


def test_trace_only_profile_shows_top_operations(browser: Any, reactor_fixture, tmp_path: Path) -> None:
    folder = reactor_fixture("no-gpu")
    (folder / "profile.summary.txt").unlink()
    opened = open_report(browser, build_report(folder, tmp_path / "trace.html"))
    text = opened.page.inner_text("#profile")
    assert "From the trace" in text
    rows = opened.page.locator("#profile table tbody tr").count()
    assert 1 <= rows <= 15
    assert "aten::" in text or "chunk_" in text
    opened.page.close()


def test_aggregate_table_has_one_column_per_agent(browser: Any, quickstart_run: Path, tmp_path: Path) -> None:
    opened = open_report(browser, build_report(quickstart_run, tmp_path / "agg.html"))
    headers = opened.page.locator("#aggregate table.aggregate thead th").all_inner_texts()
    agents = [e["agent_ref"]["name"] for e in json.loads(quickstart_run.with_name("eval_aggregate_metrics.json").read_text())]
    assert headers == ["level", "metric", *agents]
    opened.page.close()
