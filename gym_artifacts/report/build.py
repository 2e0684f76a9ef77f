"""Gathers a run's content and renders the report page (see ``page.py`` for the markup)."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import logging
import math
import os
import urllib.parse
from pathlib import Path
from typing import Any

from gym_artifacts.core.atomic import atomic_write_bytes
from gym_artifacts.core.jsonio import escaped_text, json_safe, metric_value, read_json
from gym_artifacts.export.status import exporter_states, exports_table
from gym_artifacts.report import charts
from gym_artifacts.report.levels import cell_text, level_table_html
from gym_artifacts.report.page import escape, masking, render_page, rollout_data_element
from gym_artifacts.report.rollouts import RolloutTable, rollout_lines
from gym_artifacts.run.aggregate import agent_labels, tracker_values
from gym_artifacts.run.artifacts import RunArtifacts, agent_label
from gym_artifacts.run.coverage import Coverage, coverage_of
from gym_artifacts.run.identity import content_identities
from gym_artifacts.run.journal import iter_journal
from gym_artifacts.run.layout import RECORDING, SESSION_TIMES
from gym_artifacts.run.names import NO_CONFIG, NO_CONFIG_PARAMS
from gym_artifacts.run.rollouts_facts import run_params
from gym_artifacts.run.run_config import backend_config, load_run_config
from gym_artifacts.run.sidecars import iter_nvml_series, nvml_summary
from gym_artifacts.run.times import run_times
from gym_artifacts.run.trajectory import failures_with_plans

logger = logging.getLogger(__name__)
EMBED_VIDEO_MAX = 5 << 20
MAX_STEP_CHARTS = 12
GPU_METRICS = {
    "gpu_util_pct": ("GPU utilisation", "%"),
    "memory_used_gb": ("memory used", "GB"),
    "power_w": ("power", "W"),
}


_e = escape  # every text of the page: secrets masked, surrogates escaped, then HTML-escaped


def _missing(message: str) -> str:
    return f'<p class="missing">{_e(message)}</p>'


def _table(headers: list[str], rows: list[list[Any]], cls: str = "") -> str:
    """A table that scrolls inside its card; values at full precision."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(cell_text(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _summary(run: RunArtifacts, identities: dict[str, str], coverage: Coverage) -> str:
    parts = [
        f"<p>Run <code>{_e(run.source)}</code></p>",
        f'<p class="coverage">Coverage: {_e(coverage.text())}.</p>',
    ]
    times_fpath = run.artifacts_dpath / SESSION_TIMES
    times = read_json(times_fpath) if times_fpath.is_file() else None
    if isinstance(times, dict):
        parts.append(_table(["session", "value"], [[k, v] for k, v in times.items()], "kv"))
    elif (when := run_times(run)) is not None:  # what the backends' runs are dated with
        source = {"journal": "from the metrics journal", "rollouts": "from the rollouts"}.get(when.source, when.source)
        rows = [["start", when.iso(when.start)], ["end", when.iso(when.end)],
                ["duration_s", round(when.end - when.start, 3)], ["times", source]]  # fmt: skip
        parts.append(_table(["eval", "value"], rows, "kv"))
    else:
        parts.append(_missing("No session times were recorded, and neither the journal nor the rollouts date the eval."))
    parts.append("<h3>Exports</h3>" + _table(*exports_table(exporter_states(run, identities))))
    parts.append(
        "<h3>Content identities</h3>"
        + _table(["artifact", "identity"], [[k, v] for k, v in identities.items()])
    )
    config, _ = backend_config(load_run_config(run))
    if config is not None:
        text = json.dumps(json_safe(config), indent=2, sort_keys=True)
        parts.append(f'<h3>Config (secrets masked)</h3><pre class="config">{_e(text)}</pre>')
    elif (told := run_params(run)) is not None:  # the params an export logs for it
        parts.append(_missing(NO_CONFIG_PARAMS))
        parts.append("<h3>Params (from the rollouts)</h3>" + _table(["param", "value"], [[k, v] for k, v in told.items()], "kv"))
    else:
        parts.append(_missing(NO_CONFIG))
    return "".join(parts)


def _aggregate(run: RunArtifacts) -> str:
    """The bounded values under the names trackers get, then the per-task and per-repeat tables."""
    if not run.has_rollouts_file or not run.aggregate_metrics_fpath.is_file():
        return _missing("No aggregate metrics: the run has no aggregate metrics file.")
    read = run.read_aggregate()
    entries = read.heads
    agents = agent_labels(entries)
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for agent, entry in zip(agents, entries, strict=True):
        name = agent_label(entry.get("agent_ref"))
        for key, value in tracker_values([entry]).items():
            level, metric = _level_of(key, name)
            cells.setdefault((level, metric), {})[agent] = value
    rows = [[level, metric, *(row.get(a, "") for a in agents)] for (level, metric), row in cells.items()]
    failed = [e for e in entries if e.get("aggregation_error")]
    note = (
        _missing(f"{len(failed)} agent(s) failed to aggregate: {failed[0]['aggregation_error']}")
        if failed
        else ""
    )
    parts = [
        note,
        _table(["level", "metric", *agents], rows, "aggregate"),
        "<p>Trackers get these under NeMo Gym's own names: <code>&lt;agent&gt;/&lt;metric&gt;</code> "
        "(agent_metrics), <code>key_metrics/&lt;agent&gt;/&lt;metric&gt;</code>, "
        "<code>perf_summary/&lt;agent&gt;/&lt;metric&gt;</code>.</p>",
    ]
    parts.extend(level_table_html(table) for table in read.tables)
    return "".join(parts)


def _level_of(tracker_name: str, agent: str) -> tuple[str, str]:
    """``(level, metric)`` of one agent's tracker name (see ``gym_artifacts.run.aggregate``)."""
    for level in ("key_metrics", "perf_summary"):
        if tracker_name.startswith(f"{level}/{agent}/"):
            return level, tracker_name[len(level) + len(agent) + 2 :]
    return "agent_metrics", tracker_name.removeprefix(f"{agent}/")


def _steps(run: RunArtifacts) -> str:
    series: dict[str, list[tuple[float, float]]] = {}
    for entry in iter_journal(run):
        if entry.step is None:
            continue
        for key, value in _flat_numbers(entry.metrics).items():
            series.setdefault(key, []).append((float(entry.step), value))
    if not series:
        return _missing("No step metrics were logged live (the run has no metrics journal).")
    charts_html = [
        charts.line_chart({key: pts}, title=key, x_label="step", y_label=key)
        for key, pts in list(series.items())[:MAX_STEP_CHARTS]
    ]
    more = len(series) - MAX_STEP_CHARTS
    tail = f"<p>{more} more metric(s) not drawn.</p>" if more > 0 else ""
    return '<div class="charts">' + "".join(charts_html) + "</div>" + tail


def _flat_numbers(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(_flat_numbers(value, name))
        else:
            number = metric_value(value)
            if number is not None:
                out[name] = number
    return out


def _gpu(run: RunArtifacts) -> str:
    figures, reason = nvml_summary(run)
    if reason is not None:
        return _missing(f"No GPU samples were recorded: {reason}.")
    per_gpu: dict[int, dict[str, list[tuple[float, float]]]] = {}
    t0: float | None = None
    for sample in iter_nvml_series(run):
        t0 = sample.time if t0 is None else t0
        for name in GPU_METRICS:
            if name in sample.metrics:
                per_gpu.setdefault(sample.gpu, {}).setdefault(name, []).append(
                    (sample.time - t0, sample.metrics[name])
                )
    parts = [_table(["figure", "value"], [[k, v] for k, v in figures.items()], "kv gpu-summary")]
    if not per_gpu:
        parts.append(
            _missing("The NVML summary has figures but no sample series (nvml_samples.jsonl) to draw.")
        )
    for gpu, metrics in sorted(per_gpu.items()):
        parts.append(f'<h3>GPU {gpu}</h3><div class="charts">')
        for name, pts in metrics.items():
            label, unit = GPU_METRICS[name]
            parts.append(
                charts.line_chart(
                    {name: pts}, title=f"GPU {gpu} {label}", x_label="time (s)", y_label=f"{label} ({unit})"
                )
            )
        parts.append("</div>")
    return "".join(parts)


def _rollouts(run: RunArtifacts, coverage: Coverage) -> tuple[str, str]:
    """(section HTML, the element carrying the table's rows; "" when there is no table)."""
    rollouts = run.rollouts_fpath
    if rollouts is None or not rollouts.is_file():
        return _missing("No rollouts: the run has no rollouts file."), ""
    table = RolloutTable()
    rewards: list[float] = []
    torn = run.partial_rollouts_line()
    note = _missing(torn.describe(rollouts) + "; its complete lines are shown.") if torn else ""
    for lineno, raw, record in rollout_lines(rollouts, torn.complete_bytes if torn else None):
        reward = metric_value(record.get("reward")) if isinstance(record, dict) else None
        if reward is not None and math.isfinite(reward):
            rewards.append(reward)
        else:
            reward = None
        table.add(str(lineno), reward, record, raw)
    scored = len(table)
    for index, record, planned in failures_with_plans(run):  # each with the input it was planned with
        request = planned.get("responses_create_params") if isinstance(planned, dict) else None
        shown = {**record, "responses_create_params": request} if isinstance(record, dict) and request else record
        table.add(f"failed {index + 1}", None, shown, None)
    if not len(table):
        return _missing("No rollouts: the rollouts file is empty."), ""
    header, rows = table.layout()
    hist = (
        charts.histogram(rewards, title="reward distribution", x_label="reward", y_label="rollouts")
        if rewards
        else ""
    )
    data = rollout_data_element(header, rows)
    failed = len(table) - scored
    counts = f"{scored:,} rollouts" + (
        f" and {failed:,} failed (from the failures sidecar)" if failed else ""
    )
    section = (
        note
        + (hist or _missing("No rollout has a numeric 'reward'."))
        + f'<p class="coverage">Coverage: {_e(coverage.text())}.</p>'
        + f"<p>{counts}. Search and sort the table; rows are drawn a page at a time.</p>"
        + '<div class="table-controls"><input id="rollout-search" type="search" placeholder="search rollouts" '
        + 'aria-label="search rollouts"> <button id="prev-page">previous</button> <span id="page-info"></span> '
        + '<button id="next-page">next</button></div>'
        + '<div class="scroll"><table id="rollout-table"><thead></thead><tbody></tbody></table></div>'
    )
    return section, data


def _recording(run: RunArtifacts, dest: Path, href: str | None) -> str:
    fpath = run.artifacts_dpath / RECORDING
    if not fpath.is_file():
        return _missing("No recording in this run.")
    if fpath.stat().st_size <= EMBED_VIDEO_MAX and href is None:
        src = "data:video/mp4;base64," + base64.b64encode(fpath.read_bytes()).decode()
    else:  # a link, never masked (it would lead nowhere); a path's bytes percent-encoded
        src = href or urllib.parse.quote(os.fsencode(os.path.relpath(fpath, dest.parent)))
    # the page's script sizes the video to its own width and height once they are known
    return (
        f'<video id="recording-video" controls preload="metadata" src="{html.escape(escaped_text(src))}"></video>'
        '<p id="recording-size" class="note"></p>'
    )


TOP_OPERATIONS = 15
TRACE_MAX_BYTES = 64 << 20  # a bigger (compressed) trace is not parsed for the report


def _profile(run: RunArtifacts) -> str:
    """The profiler's top operations: from its summary table, else from the trace itself."""
    fpath = run.artifacts_dpath / "profile.summary.txt"
    if fpath.is_file():
        table = _summary_table(fpath.read_text(errors="replace").splitlines())
        if table:
            return table
    trace = run.artifacts_dpath / "profile.pt.trace.json.gz"
    if trace.is_file():
        return _trace_table(trace)
    return _missing("No profiler summary or trace in this run.")


def _summary_table(lines: list[str]) -> str:
    rows: list[list[str]] = []
    header: list[str] | None = None
    for line in lines:
        if line.strip().startswith("Name") and header is None:
            header = [h for h in (c.strip() for c in line.split("  ")) if h]
            continue
        if header and line.strip() and not line.strip().startswith("-") and not line.startswith("Self "):
            cells = [c for c in (c.strip() for c in line.split("  ")) if c]
            if len(cells) == len(header):
                rows.append(cells)
    if not header or not rows:
        return f"<pre>{_e(chr(10).join(lines[:40]))}</pre>" if any(x.strip() for x in lines) else ""
    return _table(header, rows[:TOP_OPERATIONS], "profile")


def _trace_table(trace: Path) -> str:
    """Top operations by total time, from the chrome trace's complete (``X``) events."""
    import gzip

    if trace.stat().st_size > TRACE_MAX_BYTES:
        return _missing(f"The profiler trace is over {TRACE_MAX_BYTES >> 20} MB; open it in a trace viewer.")
    try:
        with gzip.open(trace, "rb") as fh:
            data = json.load(fh)
        events = data["traceEvents"] if isinstance(data, dict) else data
    except (OSError, ValueError, KeyError, EOFError) as exc:
        return _missing(f"The profiler trace cannot be read: {exc}")
    totals: dict[tuple[str, str], list[float]] = {}
    for ev in events if isinstance(events, list) else []:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or not isinstance(ev.get("dur"), int | float):
            continue
        acc = totals.setdefault((str(ev.get("name")), str(ev.get("cat") or "")), [0.0, 0])
        acc[0] += float(ev["dur"])
        acc[1] += 1
    if not totals:
        return _missing("The profiler trace holds no timed operations.")
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:TOP_OPERATIONS]
    rows = [[name, cat, int(n), f"{total / 1000:.3f}", f"{total / n:.1f}"] for (name, cat), (total, n) in top]
    return "<p>From the trace (no summary table in this run).</p>" + _table(
        ["operation", "category", "calls", "total (ms)", "mean (us)"], rows, "profile"
    )


def _run_config_secrets(run: RunArtifacts) -> frozenset[str]:
    """The secrets the run's saved config holds (none when it has no readable config)."""
    from gym_artifacts.core.errors import GymArtifactsError
    from gym_artifacts.run.run_config import backend_config, load_run_config

    try:
        return backend_config(load_run_config(run))[1]
    except GymArtifactsError:
        return frozenset()


def build_report(
    run: RunArtifacts | str | os.PathLike[str],
    dest: Path | str | None = None,
    *,
    recording_href: str | None = None,
    identities: dict[str, str] | None = None,
    coverage: Coverage | None = None,
    secrets: frozenset[str] = frozenset(),
) -> Path:
    """Write the run's report (default ``STEM_report.html`` beside the run); returns its path.

    ``identities`` and ``coverage``, when an export has computed them, are used as they are
    (the run is not hashed again). ``secrets``: values masked in every value the page shows
    (a report that an export ships must not quote a config secret the run's own files hold),
    before it is rendered: the page's own script and packed data are never rewritten; by
    default the secrets of the run's own config (a report is shared as readily as an export).
    """
    run = run if isinstance(run, RunArtifacts) else RunArtifacts.from_path(run)
    run.require_present()
    if not secrets:
        secrets = _run_config_secrets(run)
    dest = Path(dest) if dest is not None else run.stem.with_name(run.stem.name + "_report.html")
    if identities is None or coverage is None:
        logger.info("hashing %s's files for the summary", run.source)
        record_counts: dict[str, int] = {}
        identities = content_identities(run, record_counts=record_counts)
        coverage = coverage_of(run, record_counts)
    logger.info("reading the rollouts for the table and histogram")
    with masking(secrets):  # every value masked before it is escaped, drawn or encoded
        rollouts_html, rollout_data = _rollouts(run, coverage)
        sections = [
            ("summary", "Run summary", _summary(run, identities, coverage)),
            ("aggregate", "Aggregate metrics", _aggregate(run)),
            ("steps", "Step metrics", _steps(run)),
            ("gpu", "GPU (NVML)", _gpu(run)),
            ("rollouts", "Rollouts", rollouts_html),
            ("recording", "Recording", _recording(run, dest, recording_href)),
            ("profile", "Profiler: top operations", _profile(run)),
        ]
        page = render_page(
            title=f"gym-artifacts report: {run.name}", sections=sections, rollout_data=rollout_data
        )
    logger.info("writing %s", dest)
    atomic_write_bytes(dest, page.encode("utf-8"))
    with contextlib.suppress(OSError):  # an earlier build's failure no longer holds
        failure_note(dest).unlink(missing_ok=True)
    return dest


def failure_note(dest: Path) -> Path:
    """Where a report build that failed says why: ``<report>.error`` beside the report."""
    return dest.with_name(dest.name + ".error")
