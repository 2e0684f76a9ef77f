"""``compare --markdown FILE``: the comparison as a pull-request comment.

A heading with the overall verdict, one table (a row per candidate and metric: verdict, status,
difference, interval, pairs, reason), the expired waivers, the tasks left out, and where the
page is. Cells are escaped (``|``, line breaks, HTML) so that a run or metric name cannot break
the table or inject markup; the text stays under GitHub's 65,536-character comment limit (the
rows past it are counted, not shown).
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

from gym_artifacts.compare.comparison import Comparison
from gym_artifacts.compare.policy import waiver_words
from gym_artifacts.core.atomic import atomic_write_bytes

COMMENT_LIMIT = 60_000  # GitHub refuses comments past 65,536 characters; room for a footer
FOOTER_ROOM = 2_000  # the page's path and the "more" lines, kept free by every section
ICONS = {"PASS": "✅", "WARN": "⚠️", "INCONCLUSIVE": "❔", "FAIL": "❌"}


MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]~|])")  # what could open a link, image, code or emphasis


def cell(value: Any) -> str:
    """One table cell, or a line's text: no ``|`` or line break can end it, no HTML is interpreted,
    and no Markdown either (a backslash before each character that opens a link, an image, code
    or emphasis, and before ``|`` and ``\\`` themselves), so the text shows as it is."""
    text = "-" if value is None else str(value)
    text = html.escape(text, quote=False).replace("\r", " ").replace("\n", " ")
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:+.4g}"


def _interval(low: float | None, high: float | None, level: float | None) -> str:
    if low is None or high is None:
        return "-"
    return f"{level:.0%} [{low:+.4g}, {high:+.4g}]" if level is not None else f"[{low:+.4g}, {high:+.4g}]"


def _rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    if comparison.policy is not None:
        head = ["candidate", "verdict", "metric", "tier", "status", "difference", "interval", "n", "reason"]
        rows = []
        for c in comparison.candidates:
            assert c.gate is not None
            verdict = f"{ICONS[c.gate['verdict']]} {c.gate['verdict']}"
            for m in c.gate["metrics"]:
                interval = _interval(m["ci_low"], m["ci_high"], m["ci_level"])
                rows.append([c.candidate.name, verdict, m["metric"], m["tier"], m["status"],
                             _num(m["difference"]), interval, str(m["n_pairs"]), m["reason"]])  # fmt: skip
        return head, rows
    head = ["candidate", "metric", "difference", "interval", "p", "n", "note"]
    rows = [
        [c.candidate.name, r.metric, _num(r.mean_diff), _interval(r.ci_low, r.ci_high, r.ci_level),
         "-" if r.p_value is None else f"{r.p_value:.3g}", str(r.n_pairs), r.note or ""]
        for c in comparison.candidates for r in c.results
    ]  # fmt: skip
    return head, rows


def _within(lines: list[str], budget: int, more: str) -> list[str]:
    """As many of ``lines`` as fit in ``budget`` characters, then ``more`` with the count left."""
    out: list[str] = []
    for line in lines:
        if budget - len(line) - 1 < 0:
            return [*out, more.format(len(lines) - len(out))]
        out.append(line)
        budget -= len(line) + 1
    return out


def _left_out(c: Any) -> str:
    p = c.pairing()
    return (
        f"{c.candidate.name}: {p['paired']} tasks paired; left out: {p['only_in_base']} only in the base, "
        f"{p['only_in_candidate']} only in the candidate, {p['input_differs']} whose inputs differ"
    )


def render_markdown(comparison: Comparison, page: Path | None = None) -> str:
    """The summary's text (see the module doc)."""
    gate = comparison.gate()
    title = f"{ICONS[gate['verdict']]} {gate['verdict']}" if gate is not None else "comparison"
    lines = [f"## gym-artifacts compare: {cell(title)}", ""]
    settings = f"alpha {comparison.alpha:g}"
    if comparison.policy is not None and gate is not None:
        settings = f"policy {cell(comparison.policy.source)}, judged on {gate['today']}, {settings}"
    lines += [f"Base **{cell(comparison.base.name)}**; {settings}.", ""]
    verdicts = [
        f"- {cell(c.verdict['text'])}" if c.gate is None
        else f"- **{cell(c.candidate.name)}**: {ICONS[c.gate['verdict']]} **{c.gate['verdict']}**"
        for c in comparison.candidates
    ]  # fmt: skip
    lines += [*_within(verdicts, COMMENT_LIMIT // 4, "- ... and {} more candidates (on the page)"), ""]
    head, rows = _rows(comparison)
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    budget = COMMENT_LIMIT - sum(len(line) + 1 for line in lines) - FOOTER_ROOM
    table += _within([("| " + " | ".join(cell(v) for v in row) + " |") for row in rows], budget - 200,
                     "\n{} more row(s) not shown (the comment limit): every one is on the page.")  # fmt: skip
    lines += [*table, ""]
    sections: list[tuple[str, list[str]]] = []
    if gate is not None:
        sections += [
            ("**Expired waivers** (no longer applied):", [waiver_words(w) for w in gate["expired_waivers"]]),
            ("**Waivers that match no task or tested metric** (they never apply):",
             [waiver_words(w) for w in gate["unmatched_waivers"]]),
        ]  # fmt: skip
    sections.append(("", [_left_out(c) for c in comparison.candidates]))
    for title, items in sections:
        if not items:
            continue
        budget = COMMENT_LIMIT - sum(len(line) + 1 for line in lines) - FOOTER_ROOM
        lines += [title] if title else []
        lines += _within([f"- {cell(x)}" for x in items], budget - len(title) - 100,
                         "- ... and {} more (on the page and in --json)")  # fmt: skip
        lines.append("")
    if page is not None:
        lines += ["", f"The page with every task's rollouts side by side: {cell(os.fspath(page))}."]
    return "\n".join(lines) + "\n"


def write_markdown(comparison: Comparison, dest: str | os.PathLike[str], page: Path | None = None) -> Path:
    """Write the summary atomically at ``dest``; returns its path."""
    dest = Path(dest)
    atomic_write_bytes(dest, render_markdown(comparison, page).encode("utf-8"))
    return dest
