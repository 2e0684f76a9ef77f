"""``python -m benchmarks [--tiny] [--only NAME ...]``: run the benchmarks and print one table."""

from __future__ import annotations

import argparse
import importlib
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Row, peak_rss_mb

BENCHMARKS = [
    "live", "tail", "identity", "large_export", "recording", "snapshot", "nvml", "startup", "ray_scale",
    "llm_backends", "traces", "gc_backlog", "live_traces",
]  # fmt: skip


def format_rows(rows: list[Row]) -> str:
    headers = ["benchmark", "figure", "baseline (same run)", "ratio", "target", "met", "peak RSS"]
    cells = [
        [
            r.name,
            r.figure,
            r.baseline,
            "-" if r.ratio is None else f"{r.ratio:,.2f}x",
            r.target,
            "-" if r.met is None else ("yes" if r.met else "NO"),
            "-" if r.peak_mb is None else f"{r.peak_mb:.0f} MB",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def cpu_seconds() -> float:
    """User + system CPU of this process and its waited-for children: the cost of a benchmark
    on a loaded machine, where wall time mostly measures the neighbours."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description="gym-artifacts benchmarks")
    parser.add_argument("--tiny", action="store_true", help="small sizes: checks the harness runs")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None)
    args = parser.parse_args()
    rows: list[Row] = []
    for name in args.only or BENCHMARKS:
        started, cpu = time.monotonic(), cpu_seconds()
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows.extend(module.run(args.tiny))
        took, used = time.monotonic() - started, cpu_seconds() - cpu
        print(f"  {name} took {took:.1f} s ({used:.1f} s of CPU)", file=sys.stderr, flush=True)
    print(format_rows(rows))
    peak = peak_rss_mb()
    print(f"\nharness peak RSS: {peak:.0f} MB; sizes: {'tiny' if args.tiny else 'full (see BENCHMARKS.md)'}")
    with open("/proc/loadavg") as fh:  # the figures' conditions: other work on the machine skews them
        print(f"load average at the end: {fh.read().strip()}; CPU used: {cpu_seconds():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
