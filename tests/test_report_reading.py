"""The report hides nothing without saying so, and no value or name breaks it.

- level tables (NeMo Gym's ``group_level_metrics``, ``repeat_level_metrics``) put the reward
  first, name every hidden column and offer a button that shows them;
- every value is the number the run holds (no silent rounding: 102.25 stays 102.25);
- at 1280 px no element is wider than the page (tables scroll inside their card);
- a metric name is plain text, whatever it holds (two ``$`` once crashed matplotlib's mathtext);
- the rollout rows embedded in the page cannot end their ``<script>`` element or switch the
  HTML parser into another state (``<!--<script>`` once blanked the table).
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_artifacts.cli import main
from gym_artifacts.report import build_report, charts
from gym_artifacts.report.page import rollout_data_element
from gym_artifacts.run.aggregate import level_tables
from tests.fixture_paths import NEMO_GYM_FIXTURES
from tests.test_report import browser, open_report, table_cells  # noqa: F401 - the shared Chromium fixture

# Elements reaching past the page's right edge that no scrolling ancestor inside the page clips.
WIDER_THAN_PAGE = """
() => {
  const width = document.documentElement.clientWidth;
  const clipped = el => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o !== 'visible') return p.getBoundingClientRect().right <= width + 0.5;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.right > width + 0.5 && !clipped(el)) out.push(el.tagName + '.' + el.className + ' ' + Math.round(r.right));
  }
  return {width, scrollWidth: document.documentElement.scrollWidth, out: out.slice(0, 20)};
}
"""


def _copy(name: str, tmp_path: Path) -> Path:
    shutil.copytree(NEMO_GYM_FIXTURES / name, tmp_path / name)
    return tmp_path / name / "rollouts.jsonl"


def _level_headers(page: Any, level: str, visible: bool = True) -> list[str]:
    selector = f"table.level.{level} thead th"
    return page.eval_on_selector_all(
        selector,
        f"ths => ths.filter(t => {'t.offsetParent !== null' if visible else 'true'}).map(t => t.innerText.trim())",
    )


@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_level_tables_show_reward_name_hidden_columns_and_every_digit(
    browser: Any, name: str, tmp_path: Path  # noqa: F811
) -> None:
    rollouts = _copy(name, tmp_path)
    entries = json.loads(rollouts.with_name("rollouts_aggregate_metrics.json").read_text())
    opened = open_report(browser, build_report(rollouts, tmp_path / "r.html"))
    page = opened.page
    page.set_viewport_size({"width": 1280, "height": 900})
    assert opened.errors == []
    tables = level_tables(entries)
    assert {t.name for t in tables} == {"group_level_metrics", "repeat_level_metrics"}
    for table in tables:
        shown = _level_headers(page, table.name)
        assert "mean/reward" in shown[:4], (table.name, shown)
        every = [c for c in table.columns if c not in ("rollout_infos", "sample")]
        hidden = [c for c in every if c not in shown]
        assert hidden, "the fixture's tables are wider than the default view"
        note = page.inner_text(f"#note-{table.name}")
        for column in hidden:
            assert column in note, (column, note)
        # the button shows them all, in the table itself
        page.click(f"button[data-show-columns='{table.name}']")
        assert sorted(_level_headers(page, table.name)) == sorted(every)
        # every cell is the run's own value, to the last digit
        headers = _level_headers(page, table.name)
        rows = page.eval_on_selector_all(
            f"table.level.{table.name} tbody tr", "trs => trs.map(r => [...r.cells].map(c => c.innerText))"
        )
        for record, texts in zip(table.records(), rows, strict=True):
            for column, text in zip(headers, texts, strict=True):
                value = record[column]
                if isinstance(value, float):
                    assert float(text) == value, (table.name, column, text, value)
    page.close()


@pytest.mark.slow
def test_a_value_like_102_25_is_not_rounded(quickstart_run: Path, tmp_path: Path) -> None:
    aggregate = quickstart_run.with_name("eval_aggregate_metrics.json")
    entries = json.loads(aggregate.read_text())
    for entry in entries:
        entry.pop("group_level_metrics", None)
    entries[0]["group_level_metrics"] = [
        {"_ng_task_index": 0, "mean/reward": 0.123456789, "mean/input_tokens": 102.25}
    ]
    aggregate.write_text(json.dumps(entries))
    text = build_report(quickstart_run, tmp_path / "r.html").read_text()
    assert "<td>102.25</td>" in text and "<td>0.123456789</td>" in text


@pytest.mark.parametrize("name", ["clean", "with-failures"])
def test_no_element_is_wider_than_the_page_at_1280_px(browser: Any, name: str, tmp_path: Path) -> None:  # noqa: F811
    rollouts = _copy(name, tmp_path)
    opened = open_report(browser, build_report(rollouts, tmp_path / "r.html"))
    page = opened.page
    page.set_viewport_size({"width": 1280, "height": 900})
    for showing_all in (False, True):
        result = page.evaluate(WIDER_THAN_PAGE)
        assert result["out"] == [] and result["scrollWidth"] <= result["width"], (showing_all, result)
        for button in page.locator("button[data-show-columns]").all():
            button.click()
    page.close()


def test_a_wrong_layout_would_be_caught(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """The width check finds a table that does not scroll inside its card."""
    page_file = tmp_path / "wide.html"
    page_file.write_text(
        "<html><body><section><table><tr>"
        + "<td>wide-cell-text</td>" * 200
        + "</tr></table></section></body></html>"
    )
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_file.as_uri())
    assert page.evaluate(WIDER_THAN_PAGE)["out"]
    page.close()


NAME = st.lists(
    st.sampled_from([*"$\\^_{}%#&<>'\" ab1/", "$$", "\\frac", "\\mathrm"]), min_size=1, max_size=15
).map("".join)


@pytest.mark.slow
@given(name=NAME)
@example(name="cost $_$ per $$")
@example(name="$\\frac{1}{0$")
@example(name="_private")  # matplotlib leaves a label starting with "_" out of a legend
@settings(max_examples=30, deadline=None)
def test_any_metric_name_is_drawn_as_plain_text(name: str) -> None:
    """Title, axis label and legend hold the name as written, character for character."""
    svg = charts.line_chart(
        {name: [(0, 1.0), (1, 2.0)], "other": [(0, 0.0)]}, title=name, x_label="step", y_label=name
    )
    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    assert texts.count(name) == 3, (name, texts)


@pytest.mark.slow
def test_a_dollar_metric_name_leaves_the_report_and_the_local_export_whole(
    quickstart_run: Path, tmp_path: Path
) -> None:
    journal = quickstart_run.with_name("eval_metrics.jsonl")
    with open(journal, "a") as fh:
        for step in range(3):
            fh.write(
                json.dumps(
                    {
                        "step": 100 + step,
                        "time": 1764526000.0 + step,
                        "metrics": {"cost $_$ per $$": step * 1.5},
                    }
                )
                + "\n"
            )
    assert main(["report", str(quickstart_run), "-o", str(tmp_path / "r.html")]) == 0
    assert "cost $_$ per $$" in (tmp_path / "r.html").read_text()
    store = tmp_path / "store"
    assert main(["export", str(quickstart_run), "-e", "local", f"exporters.local.root={store}", "-q"]) == 0
    [run_json] = store.rglob("run.json")
    assert json.loads(run_json.read_text()).get("report") == "report.html"


HOSTILE = st.lists(
    st.sampled_from(
        ["<!--", "<script", "<SCRIPT>", "</script>", "</", "-->", "<", ">", "&lt;", "x", "\u2028", "\\", '"']
    ),
    max_size=12,
).map("".join)


@given(cells=st.lists(HOSTILE, min_size=1, max_size=5))
@example(cells=["<!--<script>"])
@example(cells=["<!--<script>", "</script><b>x</b>"])
@settings(max_examples=100, deadline=None)
def test_embedded_rows_cannot_leave_their_element(cells: list[str]) -> None:
    element = rollout_data_element(["text"], [[c] for c in cells])
    start, end = element.index(">") + 1, element.rindex("</script>")
    body = element[start:end]
    assert "<" not in body  # nothing the HTML parser could read as markup or a comment
    assert json.loads(body)["rows"] == [[c] for c in cells]


@pytest.mark.parametrize(
    "texts",
    [
        ["<!--<script>", "plain"],
        ["<!--<script>", "</script><b>bold</b>", "<!-- -->", "<SCRIPT>alert(1)</SCRIPT>", "plain"],
    ],
)
def test_a_rollout_holding_markup_shows_in_the_table(
    browser: Any, texts: list[str], quickstart_run: Path, tmp_path: Path  # noqa: F811
) -> None:
    quickstart_run.write_text(
        "".join(json.dumps({"task_index": i, "reward": 0.5, "note": t}) + "\n" for i, t in enumerate(texts))
    )
    quickstart_run.with_name("eval_aggregate_metrics.json").touch()
    opened = open_report(browser, build_report(quickstart_run, tmp_path / "r.html"))
    assert opened.errors == []
    _, rows = table_cells(opened.page)
    assert [r["note"] for r in rows] == texts
    opened.page.close()
