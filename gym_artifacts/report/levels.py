"""NeMo Gym's level tables (``group_level_metrics``, ``repeat_level_metrics``) as report tables.

A level table can hold dozens of columns (every statistic of every metric). The report shows the
ones a reader needs first, in this order: who and which (agent, task or repeat index), the mean
reward, the counts, the other reward statistics, then the rest; past ``SHOWN_COLUMNS`` the others
are hidden, named in a note beside the table, and shown by its button (they are in the page, so
nothing is fetched). Nested columns (``sample``, ``rollout_infos``) are never drawn; the note
names them too. Values are written at full precision (see :func:`cell_text`).
"""

from __future__ import annotations

import itertools
from typing import Any

from gym_artifacts.report.page import escape
from gym_artifacts.run.aggregate import LevelTable

SHOWN_COLUMNS = 10
MAX_ROWS = 200
NESTED = ("rollout_infos", "sample")
COUNTS = ("num_rollouts", "sample_count", "expected_num_rollouts", "missing_num_rollouts", "missing_count")


def cell_text(value: Any) -> str:
    """A value as the run holds it: a float by its shortest round-trip form (102.25 stays 102.25,
    0.1 stays 0.1), never rounded to a few significant digits."""
    if isinstance(value, float):
        return repr(value)
    return "" if value is None else str(value)


def column_order(table: LevelTable) -> list[str]:
    """The flat columns, most needed first (see the module's docstring)."""
    flat = [c for c in table.columns if c not in NESTED]
    first = [c for c in flat if c in ("agent", table.index)]
    rewards = [c for c in flat if c.endswith("/reward") or c == "reward"]
    mean_reward = [c for c in rewards if c in ("mean/reward", "reward")]
    counts = [c for c in COUNTS if c in flat]
    ordered = first + mean_reward + counts + [c for c in rewards if c not in mean_reward]
    return ordered + [c for c in flat if c not in ordered]


def level_table_html(table: LevelTable) -> str:
    """Heading, note (hidden columns and rows) and the table, every column in the markup."""
    columns = column_order(table)
    hidden = columns[SHOWN_COLUMNS:]
    nested = [c for c in NESTED if c in table.columns]
    name = escape(table.name)

    def cls(i: int) -> str:
        return ' class="extra"' if i >= SHOWN_COLUMNS else ""

    head = "".join(f"<th{cls(i)}>{escape(c)}</th>" for i, c in enumerate(columns))
    records = list(itertools.islice(table.iter_records(), MAX_ROWS))
    body = "".join(
        "<tr>"
        + "".join(f"<td{cls(i)}>{escape(cell_text(rec.get(c)))}</td>" for i, c in enumerate(columns))
        + "</tr>"
        for rec in records
    )
    notes: list[str] = []
    if hidden:
        notes.append(
            f"Showing {SHOWN_COLUMNS} of {len(columns)} columns; hidden: "
            + ", ".join(f"<code>{escape(c)}</code>" for c in hidden)
            + f'. <button type="button" data-show-columns="{name}" data-label="show all {len(columns)} columns">'
            f"show all {len(columns)} columns</button>"
        )
    if nested:
        notes.append(
            "Not drawn (nested values; in the exported table): "
            + ", ".join(f"<code>{escape(c)}</code>" for c in nested)
            + "."
        )
    more = len(table.rows) - MAX_ROWS
    if more > 0:
        notes.append(f"{more:,} more rows in the exported table.")
    note = f'<p class="note" id="note-{name}">' + " ".join(notes) + "</p>" if notes else ""
    return (
        f"<h3>{name} (a row per {escape(table.index)})</h3>{note}"
        f'<div class="scroll"><table class="level {name}" id="level-{name}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
