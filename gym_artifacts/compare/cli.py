"""``gym-artifacts compare BASE CANDIDATE...``: argv and printing only (``compare_runs`` decides).

Prints one verdict line per candidate, then the per-metric table, the pairing counts and where
the page was written; ``--json`` prints the comparison as one JSON object instead. ``--policy``
adds the release gate's verdict per candidate (``gate``) and ``--markdown`` writes its summary
for a pull request. ``--log`` sends it to the configured trackers once
(``gym_artifacts.compare.log``).

Exit codes: 2 for unusable arguments, a bad policy file, a run that does not exist or cannot be
read, or runs that are not of the same tasks; else 1 when ``--log`` failed for a tracker; else,
with ``--policy``, the worst candidate's verdict (``gate.EXIT_CODES``: PASS 0, WARN 3,
INCONCLUSIVE 4, FAIL 5); else 0 (the comparison was made, whatever it says). Ctrl-C: 130, with
one line (and the comparison printed, when only ``--log`` was cut).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gym_artifacts.core.text_table import format_table

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as export


def add_compare_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``compare`` subcommand to the CLI's subparsers."""
    cp = sub.add_parser(
        "compare",
        parents=parents,
        help="is the candidate better than the base, on which tasks, how sure (paired test, HTML page)",
    )
    cp.add_argument("base", metavar="BASE", help="the base run (OUT.jsonl or an artifacts folder)")
    cp.add_argument("candidates", nargs="+", metavar="CANDIDATE", help="runs compared with the base")
    cp.add_argument("-o", "--output", type=Path, help="the page (default: compare.html here)")
    cp.add_argument(
        "--metric", action="append", default=None, metavar="NAME",
        help="metric to test (repeatable; the first decides the verdict). Default: every metric both "
        "runs have, reward first",
    )  # fmt: skip
    cp.add_argument(
        "--alpha", type=float, default=None, metavar="A", help="significance level (default 0.05)"
    )
    cp.add_argument(
        "--margin", type=float, default=None, metavar="M",
        help="test non-inferiority: is the candidate not worse than the base by more than M (one-sided)",
    )  # fmt: skip
    cp.add_argument(
        "--policy", type=Path, metavar="FILE",
        help="release policy (YAML: metrics with direction, margin, alternative, tier; coverage; "
        "waivers): a PASS / WARN / FAIL / INCONCLUSIVE verdict per candidate, as the exit code "
        "(PASS 0, WARN 3, INCONCLUSIVE 4, FAIL 5)",
    )  # fmt: skip
    cp.add_argument(
        "--markdown", type=Path, metavar="FILE", help="write a Markdown summary (a pull-request comment)"
    )
    cp.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    cp.add_argument("--log", action="store_true", help="send it to the configured trackers, once")
    cp.add_argument("-c", "--config", type=Path, help="YAML config choosing the trackers for --log")
    cp.add_argument(
        "-e", "--exporter", action="append", default=[], metavar="NAME",
        help="with --log: only this tracker (repeatable)",
    )  # fmt: skip
    return cp


def format_comparison(comparison: Any, page: Path) -> str:
    """What the command prints: verdicts, the per-metric table, the pairing, the page's path."""
    from gym_artifacts.compare.policy import waiver_words

    lines = [c.verdict["text"] for c in comparison.candidates]
    gate = comparison.gate()
    if gate is not None:
        lines.append("")
        for c in comparison.candidates:
            assert c.gate is not None
            lines.append(f"{c.gate['verdict']}: {c.candidate.name}: " + "; ".join(c.gate["reasons"]))
        for w in gate["expired_waivers"]:
            lines.append(f"expired waiver (not applied): {waiver_words(w)}")
        for w in gate["unmatched_waivers"]:
            lines.append(f"waiver matching no task or tested metric (never applies): {waiver_words(w)}")
    rows = []
    for c in comparison.candidates:
        for r in c.results:
            ci = "-" if r.ci_low is None else f"[{r.ci_low:+.4g}, {r.ci_high:+.4g}]"
            rows.append([
                c.candidate.name, r.metric, str(r.n_pairs),
                "-" if r.mean_diff is None else f"{r.mean_diff:+.4g}",
                "-" if r.se is None else f"{r.se:.4g}", ci,
                "-" if r.p_value is None else f"{r.p_value:.3g}",
                "-" if r.significant is None else ("yes" if r.significant else "no"),
                "-" if r.minimum_detectable_effect is None else f"{r.minimum_detectable_effect:.4g}",
                r.note or "",
            ])  # fmt: skip
    level = (
        f"{1 - comparison.alpha:.0%} CI"
        if comparison.margin is None
        else f"{1 - 2 * comparison.alpha:.0%} CI"
    )
    headers = ["candidate", "metric", "n", "diff", "se", level, "p", "significant", "mde@80%", "note"]
    lines += ["", format_table(headers, rows), ""]
    for c in comparison.candidates:
        p = c.pairing()
        line = (
            f"{c.candidate.name}: {p['paired']} tasks paired, {p['only_in_base']} only in the base, "
            f"{p['only_in_candidate']} only in the candidate, {p['in_neither']} in neither, "
            f"{p['tasks_with_failed_rollouts']} with failed rollouts"
        )
        if p["input_differs"]:
            line += f", {p['input_differs']} tasks whose inputs differ (left out)"
        unpaired = p["only_in_base_tasks"] + p["only_in_candidate_tasks"] + p["in_neither_tasks"]
        if unpaired:
            shown = ", ".join(f"{u['task']} ({u['base']}/{u['candidate']})" for u in unpaired[:10])
            line += f"; unpaired (base/candidate): {shown}" + (" ..." if len(unpaired) > 10 else "")
        lines.append(line)
    lines.append(f"page: {page}")
    return "\n".join(lines)


def cmd_compare(ns: argparse.Namespace) -> int:
    """``compare_runs`` with the parsed arguments; the page written, the result printed."""
    from gym_artifacts.compare.comparison import compare_runs
    from gym_artifacts.compare.gate import EXIT_CODES
    from gym_artifacts.compare.markdown import write_markdown
    from gym_artifacts.compare.page import write_compare_page
    from gym_artifacts.compare.policy import load_policy
    from gym_artifacts.compare.stats import DEFAULT_ALPHA
    from gym_artifacts.core.errors import GymArtifactsError

    try:
        policy = None
        if ns.policy is not None:
            if ns.metric or ns.margin is not None or ns.alpha is not None:
                raise GymArtifactsError(
                    "--policy names the metrics, their margins and alpha: "
                    "leave out --metric, --margin and --alpha"
                )
            policy = load_policy(ns.policy)
        alpha = DEFAULT_ALPHA if ns.alpha is None else ns.alpha
        comparison = compare_runs(
            ns.base, ns.candidates, metrics=ns.metric, alpha=alpha, margin=ns.margin, policy=policy
        )
        page = write_compare_page(comparison, ns.output or Path("compare.html"))
        if ns.markdown is not None:
            write_markdown(comparison, ns.markdown, page)
    except (GymArtifactsError, OSError) as exc:
        print(f"gym-artifacts: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gym-artifacts: interrupted before the comparison was finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    gate = comparison.gate()
    code = EXIT_CODES[gate["verdict"]] if gate is not None else EXIT_OK
    logged: list[dict[str, Any]] = []
    if ns.log:
        from gym_artifacts.compare.log import log_comparison

        try:
            logged = log_comparison(comparison, page, ns.config, exporters=ns.exporter)
        except GymArtifactsError as exc:
            print(f"gym-artifacts: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:  # the comparison is made: print it; a tracker logged has its receipt
            print(format_comparison(comparison, page))
            print(
                "gym-artifacts: interrupted while logging: a tracker that finished has its receipt; "
                "run the command again to log the rest (nothing is logged twice)",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        if any(r["status"] == "FAILED" for r in logged):
            code = EXIT_FAILED
    if ns.json:
        out = comparison.to_json()
        out["page"] = str(page)
        if ns.log:
            out["logged"] = logged
        print(json.dumps(out, indent=2, allow_nan=False))
        return code
    print(format_comparison(comparison, page))
    for r in logged:
        where = " ".join(str(r.get(k) or "") for k in ("backend_run_id", "reason")).strip()
        print(f"logged to {r['exporter']}: {r['status']} {where}".rstrip())
    return code
