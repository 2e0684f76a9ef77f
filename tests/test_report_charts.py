"""Every drawn mark of every chart lies inside its chart's frame, in real headless Chromium."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts.report import charts
from tests.test_report import browser  # noqa: F401 - the shared Chromium fixture

TOLERANCE_PX = 1.0

# Every mark of every chart against its frame: [chart id, mark id, overflow in px] when outside.
OUTSIDE = """
() => {
  const out = [];
  let marks = 0;
  for (const chart of document.querySelectorAll('div.chart')) {
    const frame = document.getElementById(chart.id + '-frame').getBoundingClientRect();
    const drawn = chart.querySelectorAll(
      `[id^="${chart.id}-series-"] > path, [id^="${chart.id}-series-"] use, [id^="${chart.id}-bar-"] > path`);
    for (const el of drawn) {
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0 && el.tagName === 'path' && !el.getAttribute('d')) continue;
      marks += 1;
      const over = Math.max(frame.left - r.left, r.right - frame.right, frame.top - r.top, r.bottom - frame.bottom);
      if (over > TOLERANCE) out.push([chart.id, el.parentElement.id, over]);
    }
  }
  return {marks, out};
}
""".replace("TOLERANCE", str(TOLERANCE_PX))


def _series(rng: random.Random) -> dict[str, list[tuple[float, float]]]:
    """Random data of every awkward shape."""
    n = rng.randint(2, 300)
    return {
        "negative": [(i, -rng.uniform(1, 100)) for i in range(n)],
        "constant": [(i, 0.78) for i in range(n)],
        "single point": [(7, rng.uniform(-1, 1))],
        "tiny range": [(i, 1 + rng.uniform(0, 1e-9)) for i in range(n)],
        "huge range": [(i, rng.uniform(-1e9, 1e9)) for i in range(n)],
        "huge offset": [(i * 1e9, 1e9 + rng.uniform(0, 1)) for i in range(n)],
        "100,000 steps": [(i, rng.gauss(0, 1) + (50 if i == 99_999 else 0)) for i in range(100_000)],
        "rewards 0-19": [(i, rng.uniform(0, 0.78)) for i in range(20)],
        "mixed sign": [(i - n / 2, rng.gauss(0, 1e-3)) for i in range(n)],
    }


def _page(tmp_path: Path, body: str) -> Path:
    page = tmp_path / "charts.html"
    page.write_text(f"<!doctype html><html><body>{body}</body></html>")
    return page


@pytest.mark.parametrize("seed", [0])
def test_every_mark_lies_inside_its_chart(browser: Any, tmp_path: Path, seed: int) -> None:  # noqa: F811
    rng = random.Random(seed)
    data = _series(rng)
    parts = [
        charts.line_chart({name: pts}, title=name, x_label="step", y_label="value") for name, pts in data.items()
    ]
    parts.append(charts.line_chart(dict(list(data.items())[:3]), title="three at once", x_label="x", y_label="y"))
    for name, pts in data.items():
        parts.append(charts.histogram([y for _, y in pts], title=f"{name} histogram", x_label="v", y_label="n"))
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(_page(tmp_path, "".join(parts)).as_uri())
    result = page.evaluate(OUTSIDE)
    page.close()
    assert result["out"] == []
    assert result["marks"] >= len(data) * 2  # lines and bars were really found and measured


def test_a_mark_outside_would_be_caught(browser: Any, tmp_path: Path) -> None:  # noqa: F811
    chart = charts.line_chart({"a": [(0, 0.0), (19, 0.78)]}, title="t", x_label="x", y_label="y")
    # push the line 200 px right: the check must see it leave the frame
    broken = chart.replace("-series-0\">", "-series-0\" transform=\"translate(200 0)\">", 1)
    assert broken != chart
    page = browser.new_page()
    page.goto(_page(tmp_path, broken).as_uri())
    result = page.evaluate(OUTSIDE)
    page.close()
    assert result["out"], result


def test_envelope_keeps_extremes_and_bounds_points() -> None:
    pts = [(float(i), 0.0) for i in range(100_000)]
    pts[54_321] = (54_321.0, 9.0)
    pts[77] = (77.0, -3.0)
    kept = charts.envelope(pts)
    assert len(kept) <= charts.MAX_POINTS
    assert (54_321.0, 9.0) in kept and (77.0, -3.0) in kept
    assert kept == sorted(kept)
