"""Secrets of any length inside pages of any content (the report and the compare page, in real
headless Chromium): the page's script still parses and runs, its tables fill, and no secret long
enough to be masked appears in what the page shows or carries; a shorter one is warned about
when the config is read.

The oracle for "no secret appears": the page is built twice from the same run, once with the
secret and once with a filler of its length in its place; the page with the secret may hold it no
more often (in its text, the attributes a reader sees, and its decoded data) than the filler page
holds it on its own (the page's fixed words: "Rollouts" holds "roll").
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import shutil
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym_artifacts.compare import compare_runs
from gym_artifacts.compare.page import write_compare_page
from gym_artifacts.core.secrets import MIN_REDACTED_SECRET
from gym_artifacts.report import build_report
from tests.conftest import copy_quickstart
from tests.test_report import browser  # noqa: F401 - the shared Chromium fixture

# Words of the page's own script, markup and packed data: a secret equal to one of them once
# turned "var data" into "var ***" (a SyntaxError: empty tables) and cut the base64 of the rows.
PAGE_WORDS = ["var", "data", "function", "return", "JSON", "parse", "rows", "columns", "AAAA", "H4sI",
              "script", "table", "class", "quot", "true", "null", "document", "length", "textContent",
              "ready", "tbody", "section", "style", "json", "type", "id", "a", "e", "=", "0", "AA"]  # fmt: skip
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.:/+=<>&\"'"
SECRETS = st.one_of(st.sampled_from(PAGE_WORDS), st.text(alphabet=ALPHABET, min_size=1, max_size=12))


class _Shown(HTMLParser):
    """What a page shows: text outside scripts and styles, comments, and the attribute values a
    reader meets (labels, titles, option values, data attributes)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.scripts: dict[str, str] = {}
        self._in: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self._in.append((tag, values.get("id")))
        self.parts.extend(v for k, v in attrs if v and (k in ("aria-label", "title", "value") or k.startswith("data-")))

    def handle_endtag(self, tag: str) -> None:
        if self._in:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        tag, element_id = self._in[-1] if self._in else ("", None)
        if tag == "script":
            self.scripts[element_id or f"script{len(self.scripts)}"] = data
        elif tag != "style":
            self.parts.append(data)

    def handle_comment(self, data: str) -> None:
        self.parts.append(data)


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [str(node)]


def shown_text(page: Path) -> str:
    """Everything the page shows or carries, decoded, joined by NULs."""
    parser = _Shown()
    parser.feed(page.read_text())
    carried: list[str] = []
    for element_id, text in parser.scripts.items():
        if element_id == "rollout-data-gz":
            carried += _strings(json.loads(gzip.decompress(base64.b64decode(text.strip()))))
        elif element_id in ("rollout-data", "compare-data"):
            carried += _strings(json.loads(text))
    return "\0".join(parser.parts + carried)


def _run_with(tmp_path: Path, secret: str, rollouts: int) -> Path:
    """A quickstart run whose config holds ``secret`` under a secret key and whose rollouts quote
    it (a field of their own, and the assistant's answer)."""
    run = copy_quickstart(tmp_path / uuid.uuid4().hex)
    config = run.with_name("eval_config.yaml")
    data = yaml.safe_load(config.read_text())
    data["judge_api_key"] = secret
    config.write_text(yaml.safe_dump(data))
    lines = []
    for line in run.read_text().splitlines()[:rollouts]:
        record = json.loads(line)
        record["note"] = f"before {secret} after {secret}"
        message = record["response"]["output"][-1]
        if message.get("type") == "message":
            message["content"][0]["text"] = f"the key is {secret}, keep it"
        lines.append(json.dumps(record) + "\n")
    run.write_text("".join(lines))
    return run


def _pages(tmp_path: Path, secret: str, rollouts: int) -> tuple[Path, Path]:
    run = _run_with(tmp_path, secret, rollouts)
    report = build_report(run, run.with_name("report.html"))
    page = write_compare_page(compare_runs(run, [run]), run.with_name("compare.html"))
    return report, page


def _open(browser: Any, fpath: Path) -> tuple[Any, list[str]]:  # noqa: F811
    """The page once its script says it is ready (polled from here: the page's CSP forbids the
    string evaluation ``wait_for_function`` polls with), and the errors it raised."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(fpath.as_uri())
    deadline = time.monotonic() + 60
    while page.evaluate("document.body.dataset.ready") != "1" and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    return page, errors


def _opens_and_fills(browser: Any, report: Path, page: Path, rollouts: int) -> None:  # noqa: F811
    opened, errors = _open(browser, report)
    try:
        assert errors == [], errors
        assert opened.locator("#rollout-table tbody tr").count() == min(50, rollouts)
    finally:
        opened.close()
    opened, errors = _open(browser, page)
    try:
        assert errors == [], errors
        assert opened.locator("#tasks-table tbody tr").count() > 0
        assert opened.locator("#base-side .samples > *").count() > 0  # a sample, or why there is none
    finally:
        opened.close()


@pytest.mark.slow
@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=SECRETS, rollouts=st.sampled_from([12, 300]))
def test_secrets_of_any_length_never_break_a_page_nor_appear_in_it(
    browser: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, secret: str, rollouts: int  # noqa: F811
) -> None:
    caplog.set_level(logging.WARNING)
    report, page = _pages(tmp_path, secret, rollouts)
    _opens_and_fills(browser, report, page, rollouts)
    if len(secret) < MIN_REDACTED_SECRET:
        warned = [r.getMessage() for r in caplog.records if "judge_api_key" in r.getMessage()]
        assert warned and "too short" in warned[0], warned
        return
    filler = "~" * len(secret)
    plain_report, plain_page = _pages(tmp_path, filler, rollouts)
    for masked, plain in ((report, plain_report), (page, plain_page)):
        assert shown_text(masked).count(secret) <= shown_text(plain).count(secret), (masked.name, secret)
    shutil.rmtree(report.parent)
    shutil.rmtree(plain_report.parent)
