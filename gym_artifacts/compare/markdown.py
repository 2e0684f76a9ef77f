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
from pathlib import Path
from typing import Any

from gym_artifacts.compare.comparison import Comparison
from gym_artifacts.compare.policy import waiver_words
from gym_artifacts.core.atomic import atomic_write_bytes

COMMENT_LIMIT = 60_000  # GitHub refuses comments past 65,536 characters; room for a footer
ICONS = {"PASS": "✅", "WARN": "⚠️", "INCONCLUSIVE": "❔", "FAIL": "❌"}


def cell(value: Any) -> str:
    """One table cell: no ``|`` or line break can end it, no HTML is interpreted."""
    text = "-" if value is None else str(value)
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


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


def render_markdown(comparison: Comparison, page: Path | None = None) -> str:
    """The summary's text (see the module doc)."""
    gate = comparison.gate()
    title = f"{ICONS[gate['verdict']]} {gate['verdict']}" if gate is not None else "comparison"
    lines = [f"## gym-artifacts compare: {cell(title)}", ""]
    settings = f"alpha {comparison.alpha:g}"
    if comparison.policy is not None and gate is not None:
        settings = f"policy `{cell(comparison.policy.source)}`, judged on {gate['today']}, {settings}"
    lines += [f"Base **{cell(comparison.base.name)}**; {settings}.", ""]
    if gate is None:
        lines += [f"- {cell(c.verdict['text'])}" for c in comparison.candidates] + [""]
    else:
        for c in comparison.candidates:
            assert c.gate is not None
            lines.append(
                f"- **{cell(c.candidate.name)}**: {ICONS[c.gate['verdict']]} **{c.gate['verdict']}**"
            )
        lines.append("")
    head, rows = _rows(comparison)
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    size = sum(len(line) for line in lines)
    shown = 0
    for row in rows:
        line = "| " + " | ".join(cell(v) for v in row) + " |"
        if size + len(line) > COMMENT_LIMIT:
            break
        table.append(line)
        size += len(line) + 1
        shown += 1
    lines += table
    if shown < len(rows):
        lines.append(
            f"\n{len(rows) - shown} more row(s) not shown (the comment limit): every one is on the page."
        )
    lines.append("")
    if gate is not None and gate["expired_waivers"]:
        lines.append("**Expired waivers** (no longer applied):")
        for w in gate["expired_waivers"]:
            lines.append(f"- {cell(waiver_words(w))}")
        lines.append("")
    if gate is not None and gate["unmatched_waivers"]:
        lines.append("**Waivers that match no task or tested metric** (they never apply):")
        for w in gate["unmatched_waivers"]:
            lines.append(f"- {cell(waiver_words(w))}")
        lines.append("")
    for c in comparison.candidates:
        p = c.pairing()
        left_out = [f"{p['only_in_base']} only in the base",
                    f"{p['only_in_candidate']} only in the candidate",
                    f"{p['input_differs']} whose inputs differ"]  # fmt: skip
        lines.append(
            f"- {cell(c.candidate.name)}: {p['paired']} tasks paired; left out: {', '.join(left_out)}"
        )
    if page is not None:
        lines += ["", f"The page with every task's rollouts side by side: `{cell(os.fspath(page))}`."]
    return "\n".join(lines) + "\n"


def write_markdown(comparison: Comparison, dest: str | os.PathLike[str], page: Path | None = None) -> Path:
    """Write the summary atomically at ``dest``; returns its path."""
    dest = Path(dest)
    atomic_write_bytes(dest, render_markdown(comparison, page).encode("utf-8"))
    return dest
