"""Charts drawn by matplotlib as inline SVG: line charts and histograms with labelled axes.

matplotlib (a maintained plotting library) chooses the axis limits from the data, so every
line and bar lies inside its axes frame whatever the range (negative, constant, a single point,
1e-9 or 1e9 wide); lines are also clipped to the frame. Text stays text (``svg.fonttype:
none``), so the page needs no font files; names are never read as mathtext (a metric name may
hold any ``$``). Long series are reduced to their per-bucket minimum
and maximum (the envelope a reader sees) before drawing. Each chart's SVG is wrapped in
``<div class="chart" data-points=N>``; its frame, lines and bars carry ids ``<chart>-frame``,
``<chart>-series-<i>`` and ``<chart>-bar-<i>`` (what the browser tests measure).
"""

from __future__ import annotations

import io
import itertools
import math
import re
import warnings
from collections.abc import Sequence
from typing import Any

from gym_artifacts.report.page import escape, shown

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
MAX_POINTS = 2000  # drawn per series: 1,000 buckets, each its minimum and maximum
_ids = itertools.count()
_XML_HEADER = re.compile(r"^<\?xml[^>]*>\s*(<!DOCTYPE[^>]*>\s*)?", re.S)
_NAMESPACES = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def envelope(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points keeping each bucket's lowest and highest value, in x order."""
    if len(points) <= limit:
        return list(points)
    buckets = max(1, limit // 2)
    size = math.ceil(len(points) / buckets)
    kept: list[tuple[float, float]] = []
    for start in range(0, len(points), size):
        chunk = points[start : start + size]
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        kept.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return kept


def _figure(title: str, x_label: str, y_label: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 2.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    # parse_math=False: a name is text, never mathtext ("loss $_$" would not parse, "$a$" would
    # lose its dollars).
    ax.set_title(shown(title), fontsize=10, loc="left", parse_math=False)
    ax.set_xlabel(shown(x_label), fontsize=9, parse_math=False)
    ax.set_ylabel(shown(y_label), fontsize=9, parse_math=False)
    ax.tick_params(labelsize=8)
    ax.grid(True, color="#e5e7eb", linewidth=0.6)
    ax.set_axisbelow(True)
    return fig, ax


def _svg(fig: Any, chart_id: str, ax: Any, points: int, kind: str, title: str) -> str:
    import matplotlib

    ax.patch.set_gid(f"{chart_id}-frame")
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": chart_id}), warnings.catch_warnings():
        # Text stays text: the browser draws it with its own fonts, so a character matplotlib's
        # font lacks (a CJK run name, a control byte of a folder name) only costs a measurement.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    # Inline SVG in HTML needs no XML header, namespaces or RDF metadata: the page names no URL.
    svg = _METADATA.sub("", _NAMESPACES.sub("", _XML_HEADER.sub("", buf.getvalue())))
    return (
        f'<div class="chart" id="{chart_id}" data-kind="{kind}" data-points="{points}" '
        f'role="img" aria-label="{escape(title)}">{svg}</div>'
    )


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]], *, title: str, x_label: str, y_label: str
) -> str:
    """One chart with a line per series (non-finite points left out); "" when nothing is finite."""
    finite = {
        name: [(float(x), float(y)) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        for name, pts in series.items()
    }
    finite = {k: sorted(v) for k, v in finite.items() if v}
    if not finite:
        return ""
    chart_id = f"chart{next(_ids)}"
    fig, ax = _figure(title, x_label, y_label)
    lines = []
    for i, (name, pts) in enumerate(finite.items()):
        drawn = envelope(pts)
        (line,) = ax.plot(
            [x for x, _ in drawn], [y for _, y in drawn], color=PALETTE[i % len(PALETTE)],
            linewidth=1.2, marker="o" if len(drawn) == 1 else None, markersize=3, label=shown(name),
        )  # fmt: skip
        line.set_gid(f"{chart_id}-series-{i}")
        lines.append(line)
    if len(finite) > 1:
        # Handles and labels given explicitly: matplotlib would drop a label starting with "_".
        for text in ax.legend(lines, [shown(name) for name in finite], fontsize=7, loc="best").get_texts():
            text.set_parse_math(False)
    ax.margins(x=0.02, y=0.08)
    return _svg(fig, chart_id, ax, sum(len(p) for p in finite.values()), "line", title)


def histogram(values: Sequence[float], *, title: str, x_label: str, y_label: str, bins: int = 20) -> str:
    """Counts of ``values`` in equal-width bins; "" when no value is finite."""
    data = [float(v) for v in values if math.isfinite(v)]
    if not data:
        return ""
    lo, hi = min(data), max(data)
    if hi == lo:  # one value: a bin of width 1 around it (relative for large values)
        half = max(0.5, abs(lo) * 1e-6)
        lo, hi = lo - half, hi + half
    chart_id = f"chart{next(_ids)}"
    fig, ax = _figure(title, x_label, y_label)
    _, _, patches = ax.hist(data, bins=bins, range=(lo, hi), color=PALETTE[0], alpha=0.85, edgecolor="white")
    for i, patch in enumerate(patches):
        patch.set_gid(f"{chart_id}-bar-{i}")
    ax.margins(x=0.02, y=0.08)
    return _svg(fig, chart_id, ax, len(data), "histogram", title)


def _literal(text: str) -> str:
    """Text matplotlib draws as written (``$`` would otherwise start math mode), as the page
    shows it (:func:`shown`: secrets masked, surrogates escaped)."""
    return shown(text).replace("$", r"\$")


def forest_plot(
    rows: Sequence[tuple[str, float | None, float | None, float | None]],
    *,
    title: str,
    x_label: str,
    references: dict[str, float] | None = None,
) -> str:
    """One row per ``(label, estimate, low, high)``: the interval as a line, the estimate as a dot.

    ``references``: vertical lines (``{"no difference": 0.0}``), drawn dashed and included in
    the axis range. A row without an estimate is labelled but not drawn; one without an interval
    is a dot alone. "" when no row has a finite estimate.
    """
    if not any(r[1] is not None and math.isfinite(r[1]) for r in rows):
        return ""
    refs = {k: float(v) for k, v in (references or {}).items() if math.isfinite(v)}
    xs = [float(v) for r in rows for v in r[1:] if v is not None and math.isfinite(v)] + list(refs.values())
    lo, hi = min(xs), max(xs)
    if hi - lo <= max(abs(lo), abs(hi)) * 1e-9:
        half = max(0.5, abs(lo) * 1e-6)
        lo, hi = lo - half, hi + half
    pad = (hi - lo) * 0.08
    chart_id = f"chart{next(_ids)}"
    from matplotlib.figure import Figure

    height = 1.0 + 0.42 * len(rows)
    fig = Figure(figsize=(6.4, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(_literal(title), fontsize=10, loc="left")
    ax.set_xlabel(_literal(x_label), fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, axis="x", color="#e5e7eb", linewidth=0.6)
    ax.set_axisbelow(True)
    for i, (name, x) in enumerate(refs.items()):
        ref = ax.axvline(
            x, color="#6b7280" if i == 0 else "#d97706", linewidth=0.9, linestyle="--", label=_literal(name)
        )
        ref.set_gid(f"{chart_id}-reference-{i}")
    drawn = 0
    for i, (_, est, low, high) in enumerate(rows):
        y = len(rows) - 1 - i
        if est is None or not math.isfinite(est):
            continue
        color = PALETTE[i % len(PALETTE)]
        if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
            (line,) = ax.plot([low, high], [y, y], color=color, linewidth=2.2, solid_capstyle="butt")
            line.set_gid(f"{chart_id}-series-{i}")
        (dot,) = ax.plot([est], [y], color=color, marker="o", markersize=5, linestyle="none")
        dot.set_gid(f"{chart_id}-estimate-{i}")
        drawn += 1
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks(range(len(rows)), [_literal(r[0]) for r in reversed(rows)], fontsize=8)
    if refs:
        ax.legend(fontsize=7, loc="best")
    return _svg(fig, chart_id, ax, drawn, "forest", title)
