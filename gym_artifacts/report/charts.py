"""Charts as inline SVG: line charts and histograms with labelled axes and units."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
MAX_POINTS = 1500


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]``."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi == lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _downsample(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return list(points)
    stride = math.ceil(len(points) / MAX_POINTS)
    return [points[i] for i in range(0, len(points), stride)] + [points[-1]]


def line_chart(
    series: dict[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 640,
    height: int = 240,
) -> str:
    """One SVG with a polyline per series; ``data-points`` counts what was drawn."""
    finite = {
        name: [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
        for name, pts in series.items()
    }
    finite = {k: v for k, v in finite.items() if v}
    if not finite:
        return ""
    xs = [x for pts in finite.values() for x, _ in pts]
    ys = [y for pts in finite.values() for _, y in pts]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    x0, x1 = x_ticks[0], x_ticks[-1] if x_ticks[-1] > x_ticks[0] else x_ticks[0] + 1
    y0, y1 = y_ticks[0], y_ticks[-1] if y_ticks[-1] > y_ticks[0] else y_ticks[0] + 1
    left, right, top, bottom = 64, 16, 28, 44
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'data-points="{sum(len(p) for p in finite.values())}" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="16" class="chart-title">{html.escape(title)}</text>',
    ]
    for t in x_ticks:
        parts.append(f'<line x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{top + plot_h}" class="grid"/>')
        parts.append(
            f'<text x="{sx(t):.1f}" y="{top + plot_h + 14}" class="tick" text-anchor="middle">{_fmt(t)}</text>'
        )
    for t in y_ticks:
        parts.append(
            f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + plot_w}" y2="{sy(t):.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>'
        )
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" class="axis-label" text-anchor="middle">'
        f"{html.escape(x_label)}</text>"
    )
    parts.append(
        f'<text transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" class="axis-label" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(finite.items()):
        color = PALETTE[i % len(PALETTE)]
        drawn = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in _downsample(pts))
        parts.append(
            f'<polyline class="series" data-series="{html.escape(name)}" fill="none" stroke="{color}" '
            f'stroke-width="1.5" points="{drawn}"><title>{html.escape(name)}</title></polyline>'
        )
        if len(finite) > 1:
            parts.append(
                f'<text x="{left + plot_w - 4}" y="{top + 12 + 12 * i}" class="legend" text-anchor="end" '
                f'fill="{color}">{html.escape(name)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def histogram(values: Sequence[float], *, title: str, x_label: str, y_label: str, bins: int = 20) -> str:
    """Counts of ``values`` in equal-width bins, as SVG bars."""
    data = [v for v in values if math.isfinite(v)]
    if not data:
        return ""
    lo, hi = min(data), max(data)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    width_bin = (hi - lo) / bins
    counts = [0] * bins
    for v in data:
        counts[min(bins - 1, int((v - lo) / width_bin))] += 1
    width, height, left, right, top, bottom = 640, 240, 64, 16, 28, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    y_ticks = nice_ticks(0, max(counts))
    top_count = y_ticks[-1] or 1
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'data-points="{len(data)}" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="16" class="chart-title">{html.escape(title)}</text>',
    ]
    for t in y_ticks:
        y = top + plot_h - t / top_count * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
    bar_w = plot_w / bins
    for i, count in enumerate(counts):
        h = count / top_count * plot_h
        parts.append(
            f'<rect class="bar" x="{left + i * bar_w + 1:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2:.1f}" '
            f'height="{h:.1f}"><title>{_fmt(lo + i * width_bin)} to {_fmt(lo + (i + 1) * width_bin)}: {count}</title></rect>'
        )
    for i in range(0, bins + 1, max(1, bins // 5)):
        x = left + i * bar_w
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 14}" class="tick" text-anchor="middle">{_fmt(lo + i * width_bin)}</text>'
        )
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" class="axis-label" text-anchor="middle">{html.escape(x_label)}</text>'
    )
    parts.append(
        f'<text transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" class="axis-label" text-anchor="middle">'
        f"{html.escape(y_label)}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)
