"""The comparison as one self-contained offline HTML page (the report's shell, styles and charts).

Sections, verdict first: the verdict of each candidate; a forest plot per metric (each
candidate's mean difference with its interval, the zero line and the margin); the per-task
deltas sorted (biggest wins and losses; choose a task to see the two runs' responses side by
side); the coverage of each run with its unpaired and failed tasks. The task rows and responses
travel as one JSON element escaped for HTML (``<``, ``>``, ``&`` as ``\\u003c``...): no embedded
text can close the script or open a comment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gym_artifacts.compare.comparison import CandidateComparison, Comparison, TaskRow
from gym_artifacts.compare.policy import waiver_words
from gym_artifacts.compare.tasks import RunTasks, TaskKey, key_id, read_samples
from gym_artifacts.core.atomic import atomic_write_bytes
from gym_artifacts.report import charts
from gym_artifacts.report.page import escape, masking, render_page, shown_values

MAX_FOREST_CHARTS = 12  # metrics drawn; the table below lists every one
SHOWN_EACH_WAY = 50  # biggest wins, biggest losses (and unpaired tasks) with their responses
TABLE_ROWS = 5000  # task rows in the page's table per candidate (all are counted)
CHART_LABEL = 40  # characters of a row label in a chart
DRAWABLE = 1e300  # magnitudes a chart axis can span (its padding and ticks overflow near 1.8e308)


_e = escape  # secrets masked (the page's ``masking``), surrogates escaped, then HTML-escaped


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def embed_json(data: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` escaped, so no ``</script>`` or ``<!--``."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _verdicts(comparison: Comparison) -> str:
    items = "".join(
        f'<li class="verdict" data-kind="{_e(c.verdict["kind"])}" data-candidate="{i}"'
        + (f' data-verdict="{_e(c.gate["verdict"])}"' if c.gate is not None else "")
        + f">{_e(c.verdict['text'])}</li>"
        for i, c in enumerate(comparison.candidates)
    )
    margin = "" if comparison.margin is None else f", margin {comparison.margin:g}"
    framing = (
        "two-sided: H0 no difference"
        if comparison.margin is None
        else "one-sided non-inferiority: H0 the candidate is worse by the margin or more"
    )
    return (
        f'<ul class="verdicts">{items}</ul>'
        f'<p class="note">Base <code>{_e(comparison.base.run.source)}</code>. Test: {_e(framing)}, '
        f"alpha {comparison.alpha:g}{_e(margin)}. One mean per task and run; paired over the tasks "
        "scored in both; Student t with n-1 degrees of freedom (NeMo Gym's statistical tests).</p>"
    )


def _chart_label(name: str) -> str:
    """A candidate's name as a chart's row label: long names (sweep folders) keep their start and
    end, so that the axes keep room to draw; the tables show every name whole."""
    return (
        name if len(name) <= CHART_LABEL else name[: CHART_LABEL // 2 - 1] + "…" + name[-(CHART_LABEL // 2) :]
    )


def _gate_section(comparison: Comparison) -> str:
    """One table for every candidate under the policy: a row per candidate and metric."""
    gate = comparison.gate()
    if gate is None:
        return ""
    head = ["candidate", "verdict", "metric", "tier", "direction", "margin", "status", "difference",
            "interval", "n pairs", "reason"]  # fmt: skip
    body = []
    for i, c in enumerate(comparison.candidates):
        assert c.gate is not None
        for m in c.gate["metrics"]:
            ci = (f"{m['ci_level']:.0%} [{_num(m['ci_low'], True)}, {_num(m['ci_high'], True)}]"
                  if m["ci_level"] is not None else "-")  # fmt: skip
            cells = [c.candidate.name, c.gate["verdict"], m["metric"], m["tier"], m["direction"].replace("_", " "),
                     f"{m['margin']:g}", m["status"], _num(m["difference"], True), ci, m["n_pairs"], m["reason"]]  # fmt: skip
            body.append(
                f'<tr data-candidate="{i}" data-verdict="{_e(c.gate["verdict"])}" data-status="{_e(m["status"])}">'
                + "".join(f"<td>{_e(x)}</td>" for x in cells) + "</tr>"
            )  # fmt: skip
    lists = "".join(
        f'<p class="note">{_e(title)}</p><ul id="{ident}">'
        + "".join(f"<li>{_e(waiver_words(w))}</li>" for w in gate[key])
        + "</ul>"
        for key, ident, title in (
            ("expired_waivers", "expired-waivers", "Expired waivers, no longer applied:"),
            (
                "unmatched_waivers",
                "unmatched-waivers",
                "Waivers that match no task or tested metric (never applied):",
            ),
        )
        if gate[key]
    )
    return (
        f'<p class="gate-verdict" data-verdict="{_e(gate["verdict"])}">Policy <code>{_e(gate["policy"]["source"])}</code>'
        f" (judged on {_e(gate['today'])}): <strong>{_e(gate['verdict'])}</strong></p>"
        '<table id="gate-table"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>" + lists
    )  # fmt: skip


def _metrics_list(comparison: Comparison) -> list[str]:
    seen: dict[str, None] = {}
    for c in comparison.candidates:
        for r in c.results:
            seen.setdefault(r.metric, None)
    return list(seen)


def _forest(comparison: Comparison) -> str:
    parts: list[str] = []
    refs: dict[str, float] = {"no difference": 0.0}
    if comparison.margin is not None:
        refs["- margin"] = -comparison.margin
    metrics = _metrics_list(comparison)
    for metric in metrics[:MAX_FOREST_CHARTS]:
        rows = []
        for c in comparison.candidates:
            r = next((r for r in c.results if r.metric == metric), None)
            values = (r.mean_diff, r.ci_low, r.ci_high) if r else (None, None, None)
            if any(v is not None and abs(v) > DRAWABLE for v in values):
                values = (None, None, None)  # past what an axis can span: the table has the figures
            rows.append((_chart_label(c.candidate.name), *values))
        chart = charts.forest_plot(
            rows, title=f"{metric}: candidate - base", x_label=f"difference in {metric}", references=refs
        )
        parts.append(chart or f'<p class="missing">{_e(metric)}: no task is in both runs.</p>')
    head = ["candidate", "metric", "n pairs", "difference", "se", "interval", "p", "significant",
            "MDE (80% power)", "note"]  # fmt: skip
    body = []
    for c in comparison.candidates:
        for r in c.results:
            ci = f"{r.ci_level:.0%} [{_num(r.ci_low, True)}, {_num(r.ci_high, True)}]" if r.ci_level else "-"
            sig = "-" if r.significant is None else ("yes" if r.significant else "no")
            cells = [c.candidate.name, r.metric, r.n_pairs, _num(r.mean_diff, True), _num(r.se), ci,
                     "-" if r.p_value is None else f"{r.p_value:.3g}", sig,
                     _num(r.minimum_detectable_effect), r.note or ""]  # fmt: skip
            body.append("<tr>" + "".join(f"<td>{_e(x)}</td>" for x in cells) + "</tr>")
    table = (
        '<table id="results-table"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    )  # fmt: skip
    more = len(metrics) - MAX_FOREST_CHARTS
    if more > 0:
        parts.append(f'<p class="note">{more} more metric(s) not drawn: every one is in the table.</p>')
    return '<div class="charts" id="forest">' + "".join(parts) + "</div>" + table


def _regression(comparison: Comparison, c: CandidateComparison) -> Any:
    """How much better each row's candidate is on the primary metric (the policy's direction:
    fewer tokens is better for a lower-is-better metric); the sort key worst first."""
    rule = comparison.policy.rule(c.primary_metric) if comparison.policy and c.primary_metric else None
    sign = -1.0 if rule is not None and rule.lower_is_better else 1.0
    return lambda r: sign * r.delta


def _shown_tasks(
    comparison: Comparison, c: CandidateComparison
) -> tuple[list[TaskRow], list[TaskRow], list[TaskRow]]:
    """(biggest wins, biggest losses, unpaired or failed tasks), each at most SHOWN_EACH_WAY."""
    better = _regression(comparison, c)
    paired = [r for r in c.rows if r.delta is not None]
    wins = sorted((r for r in paired if better(r) > 0), key=lambda r: -better(r))[:SHOWN_EACH_WAY]
    losses = sorted((r for r in paired if better(r) < 0), key=better)[:SHOWN_EACH_WAY]
    other = [r for r in c.rows if r.delta is None or r.base_failed or r.candidate_failed]
    return wins, losses, other[:SHOWN_EACH_WAY]


def _row(r: TaskRow) -> dict[str, Any]:
    """A task row as the page's script reads it: the key as one string (``key_id``), the task as
    text, every number finite."""
    return {**r.to_json(), "task": str(r.key), "key": key_id(r.key)}


def _task_data(comparison: Comparison, c: CandidateComparison) -> dict[str, Any]:
    """One candidate's rows, worst regression first, and the rollouts of the tasks shown."""
    base: RunTasks = comparison.base
    wins, losses, other = _shown_tasks(comparison, c)
    better = _regression(comparison, c)
    ordered = sorted(c.rows, key=lambda r: (r.delta is None, better(r) if r.delta is not None else 0.0))
    shown: set[TaskKey] = {r.key for r in (*ordered[:SHOWN_EACH_WAY], *wins, *losses, *other)}
    base_samples, cand_samples = read_samples(base, shown), read_samples(c.candidate, shown)
    position = {r.key: i for i, r in enumerate(ordered)}  # the select box lists them worst first
    return {
        "candidate": c.candidate.name,
        "metric": c.primary_metric,
        "rows": [_row(r) for r in ordered[:TABLE_ROWS]],
        "rows_total": len(c.rows),
        "wins": [key_id(r.key) for r in wins],
        "losses": [key_id(r.key) for r in losses],
        "samples": {
            # keyed as the rows' ``key`` reads once masked (``shown_values`` leaves keys as they are)
            shown_values(key_id(k)): {"base": base_samples.get(k, []), "candidate": cand_samples.get(k, [])}
            for k in sorted(shown, key=lambda k: position.get(k, 0))
        },
    }


def _tasks_section(comparison: Comparison) -> str:
    options = "".join(
        f'<option value="{i}">{_e(c.candidate.name)}</option>' for i, c in enumerate(comparison.candidates)
    )
    return (
        f'<p>Candidate <select id="candidate-select">{options}</select> '
        'task <select id="task-select" aria-label="task"></select> '
        '<span id="task-delta"></span></p>'
        f'<div id="task-view" class="side-by-side"><div class="side" id="base-side"><h3>base: {_e(comparison.base.name)}</h3>'
        '<div class="samples"></div></div><div class="side" id="candidate-side"><h3 id="candidate-title">candidate</h3>'
        '<div class="samples"></div></div></div>'
        '<h3>Biggest wins</h3><table id="wins-table" class="tasks"><thead></thead><tbody></tbody></table>'
        '<h3>Biggest losses</h3><table id="losses-table" class="tasks"><thead></thead><tbody></tbody></table>'
        '<h3>Every task, worst regression first</h3><p id="rows-info" class="note"></p>'
        '<table id="tasks-table" class="tasks"><thead></thead><tbody></tbody></table>'
    )


def _coverage(comparison: Comparison) -> str:
    head = ["run", "role", "task key", "tasks scored", "tasks failed (every rollout)", "tasks planned",
            "rollouts scored", "rollouts failed", "rollouts with no task key", "coverage"]  # fmt: skip
    runs = [("base", comparison.base)] + [("candidate", c.candidate) for c in comparison.candidates]
    body = []
    for role, t in runs:
        s = t.summary()
        cov = s["coverage"]["text"] if s["coverage"] else (t.note or "-")
        if t.torn is not None:
            cov += "; the last rollouts line is partial (left out)"
        cells = [t.name, role, ", ".join(s["task_key"] or ["-"]), s["tasks_scored"], s["tasks_failed"],
                 "-" if s["tasks_planned"] is None else s["tasks_planned"], s["rollouts_scored"],
                 s["rollouts_failed"], s["rollouts_unkeyed"], cov]  # fmt: skip
        body.append(f'<tr data-role="{role}">' + "".join(f"<td>{_e(x)}</td>" for x in cells) + "</tr>")
    parts = [
        '<table id="coverage-table"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    ]  # fmt: skip
    for c in comparison.candidates:
        p = c.pairing()
        parts.append(
            f'<h3>{_e(c.candidate.name)} against the base</h3><p class="pairing">'
            f"{p['paired']} tasks paired; {p['only_in_base']} only in the base; "
            f"{p['only_in_candidate']} only in the candidate; {p['in_neither']} scored in neither; "
            f"{p['tasks_with_failed_rollouts']} with failed rollouts.</p>"
        )
        unpaired = [r for r in c.rows if r.delta is None or r.base_failed or r.candidate_failed][:200]
        if unpaired:
            rows = "".join(
                "<tr>" + "".join(f"<td>{_e(x)}</td>" for x in (
                    r.key, r.base_state, r.candidate_state, r.base_failed, r.candidate_failed)) + "</tr>"
                for r in unpaired
            )  # fmt: skip
            parts.append(
                '<table class="unpaired"><thead><tr><th>task</th><th>base</th><th>candidate</th>'
                "<th>base failed rollouts</th><th>candidate failed rollouts</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>"
            )
    return "".join(parts)


EXTRA_STYLE = """
ul.verdicts { list-style: none; padding: 0; margin: 0; }
li.verdict { font-size: 16px; font-weight: 600; padding: 8px 12px; border-radius: 6px; margin: 6px 0; background: #f3f4f6; }
li.verdict[data-kind="higher"], li.verdict[data-kind="non-inferior"] { background: #ecfdf5; color: #065f46; }
li.verdict[data-kind="lower"], li.verdict[data-kind="not-shown"] { background: #fef2f2; color: #991b1b; }
li.verdict[data-kind="cannot-tell"] { background: #fffbeb; color: #92400e; }
.side-by-side { display: flex; gap: 12px; align-items: stretch; }
.side { flex: 1 1 0; min-width: 0; border: 1px solid #e5e7eb; border-radius: 6px; padding: 6px 10px; }
.sample { border-top: 1px solid #e5e7eb; padding: 6px 0; }
.sample pre { white-space: pre-wrap; word-break: break-word; background: #f9fafb; padding: 6px; margin: 4px 0; }
.sample.failed { color: #991b1b; }
table.tasks tbody tr { cursor: pointer; } table.tasks tbody tr:hover { background: #eff6ff; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("compare-data").textContent);
  var candSelect = document.getElementById("candidate-select");
  var taskSelect = document.getElementById("task-select");
  var current = 0;
  function text(v) { return v === null || v === undefined ? "-" : String(v); }
  function num(v, signed) {
    if (v === null || v === undefined) return "-";
    var s = Number(v.toPrecision(4)).toString();
    return signed && v > 0 ? "+" + s : s;
  }
  function fillTable(id, rows) {
    var table = document.getElementById(id);
    var head = ["task", "base", "candidate", "base value", "candidate value", "delta", "base failed", "candidate failed"];
    table.tHead.replaceChildren();
    var hr = table.tHead.insertRow();
    head.forEach(function (h) { var th = document.createElement("th"); th.textContent = h; hr.appendChild(th); });
    var fragment = document.createDocumentFragment();
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      tr.dataset.task = r.key;
      [text(r.task), r.base, r.candidate, num(r.base_value), num(r.candidate_value), num(r.delta, true),
       text(r.base_failed_rollouts), text(r.candidate_failed_rollouts)].forEach(function (v) {
        var td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      });
      tr.addEventListener("click", function () { showTask(tr.dataset.task); });
      fragment.appendChild(tr);
    });
    table.tBodies[0].replaceChildren(fragment);
  }
  function sampleBox(s) {
    var div = document.createElement("div");
    div.className = "sample" + (s.failed ? " failed" : "");
    var head = document.createElement("div");
    head.className = "sample-head";
    head.textContent = (s.failed ? "FAILED" : "reward " + num(s.reward)) +
      (s.repeat !== null && s.repeat !== undefined ? " (repeat " + s.repeat + ")" : "") +
      (s.failure ? " - " + s.failure + (s.reason ? ": " + s.reason : "") : "");
    div.appendChild(head);
    [["conversation", s.conversation], ["tool calls", s.tool_calls], ["tool results", s.tool_results],
     ["response", s.response]].forEach(function (p) {
      if (!p[1]) return;
      var label = document.createElement("div"); label.className = "note"; label.textContent = p[0];
      var pre = document.createElement("pre"); pre.className = p[0].replace(" ", "-"); pre.textContent = p[1];
      div.appendChild(label); div.appendChild(pre);
    });
    return div;
  }
  function fillSide(id, samples, state) {
    var box = document.querySelector("#" + id + " .samples");
    box.replaceChildren();
    if (!samples || !samples.length) {
      var p = document.createElement("p"); p.className = "missing";
      p.textContent = state === "absent" ? "this run has no such task" :
        state === "no result" ? "planned, but no rollout finished" : "no rollout of this task is embedded";
      box.appendChild(p);
      return;
    }
    samples.forEach(function (s) { box.appendChild(sampleBox(s)); });
  }
  function rowOf(key) {
    var rows = data.candidates[current].rows;
    for (var i = 0; i < rows.length; i++) if (rows[i].key === key) return rows[i];
    return null;
  }
  function showTask(key) {
    var c = data.candidates[current];
    var pair = Object.prototype.hasOwnProperty.call(c.samples, key) ? c.samples[key] : {base: [], candidate: []};
    var row = rowOf(key);
    taskSelect.value = key;
    document.getElementById("task-view").dataset.task = key;
    fillSide("base-side", pair.base, row ? row.base : "absent");
    fillSide("candidate-side", pair.candidate, row ? row.candidate : "absent");
    document.getElementById("task-delta").textContent = row ?
      c.metric + ": base " + num(row.base_value) + ", candidate " + num(row.candidate_value) +
      " (delta " + num(row.delta, true) + "; base " + row.base + ", candidate " + row.candidate + ")" : "";
  }
  function showCandidate(i) {
    current = i;
    var c = data.candidates[i];
    document.getElementById("candidate-title").textContent = "candidate: " + c.candidate;
    var byKey = new Map();
    c.rows.forEach(function (r) { byKey.set(r.key, r); });
    function pick(keys) { return keys.map(function (k) { return byKey.get(k); }).filter(Boolean); }
    fillTable("wins-table", pick(c.wins));
    fillTable("losses-table", pick(c.losses));
    fillTable("tasks-table", c.rows);
    document.getElementById("rows-info").textContent = c.rows.length < c.rows_total ?
      "the " + c.rows.length + " largest of " + c.rows_total + " tasks" : c.rows_total + " tasks";
    taskSelect.replaceChildren();
    Object.keys(c.samples).forEach(function (key) {
      var row = byKey.get(key);
      var o = document.createElement("option"); o.value = key;
      o.textContent = "task " + (row ? row.task : key);
      taskSelect.appendChild(o);
    });
    var key = c.losses.length ? c.losses[0] : c.wins.length ? c.wins[0] : Object.keys(c.samples)[0];
    if (key !== undefined) showTask(key);
  }
  candSelect.addEventListener("change", function () { showCandidate(+candSelect.value); });
  taskSelect.addEventListener("change", function () { showTask(taskSelect.value); });
  if (data.candidates.length) showCandidate(0);
  document.body.dataset.ready = "1";
})();
"""


def page_data(comparison: Comparison) -> dict[str, Any]:
    """Everything the page's script reads (task rows and rollouts), as plain data with every
    secret of either run masked in its values: what is embedded, once encoded (``embed_json``)."""
    with masking(_secrets(comparison)):
        return shown_values({"candidates": [_task_data(comparison, c) for c in comparison.candidates]})


def render_compare_page(comparison: Comparison) -> str:
    """The page's HTML text."""
    # Secret values from either run's config never reach the page (it may be logged to a
    # tracker): masked in every value before it is rendered, never in the rendered page.
    with masking(_secrets(comparison)):
        data = page_data(comparison)
        names = ", ".join(c.candidate.name for c in comparison.candidates)
        sections = [
            ("verdict", "Verdict", _verdicts(comparison) + _gate_section(comparison)),
            ("differences", "Differences by metric", _forest(comparison)),
            ("tasks", "Per-task differences", _tasks_section(comparison)),
            ("coverage", "Coverage of each run", _coverage(comparison)),
        ]
        element = f'<script type="application/json" id="compare-data">{embed_json(data)}</script>'
        return render_page(
            title=f"gym-artifacts compare: {comparison.base.name} vs {names}",
            sections=sections,
            rollout_data=element,
            script=SCRIPT,
            extra_style=EXTRA_STYLE,
        )


def _secrets(comparison: Comparison) -> frozenset[str]:
    from gym_artifacts.core.errors import GymArtifactsError
    from gym_artifacts.run.run_config import backend_config, load_run_config

    found: set[str] = set()
    for tasks in (comparison.base, *(c.candidate for c in comparison.candidates)):
        try:
            found |= backend_config(load_run_config(tasks.run))[1]
        except (GymArtifactsError, OSError, ValueError):
            continue  # an unreadable config holds no secret this page could show
    return frozenset(found)


def write_compare_page(comparison: Comparison, dest: str | os.PathLike[str]) -> Path:
    """Write the page atomically at ``dest``; returns its path."""
    dest = Path(dest)
    atomic_write_bytes(dest, render_compare_page(comparison).encode("utf-8"))
    return dest
