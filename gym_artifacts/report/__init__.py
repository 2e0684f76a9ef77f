"""A run as one self-contained HTML page: summary, metrics, GPU series, rollouts, recording.

No network at view time: no CDN, no external fonts; styles, scripts and charts (inline SVG drawn
here) are in the file. ``build_report(run, dest)`` writes it; the CLI's ``report`` command and
the local backend call it.
"""

from __future__ import annotations

from gym_artifacts.report.build import build_report

__all__ = ["build_report"]
