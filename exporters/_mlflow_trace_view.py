"""Where MLflow's UI shows a run's traces, whatever their age.

MLflow 3.17's experiment pages (the Overview and the Traces tab) show the last 7 days unless
their URL names a range: ``startTimeLabel`` (``LAST_7_DAYS`` when absent; ``ALL``, ``CUSTOM``,
...) and, for ``CUSTOM``, ``startTime`` / ``endTime`` as ISO 8601 (MLflow's
``useMonitoringFilters``; the filter is on each trace's start). A rollout's trace keeps its
real time, so an eval that ran more than a week before someone looks shows "Traces 0" and
MLflow's onboarding page there; the run's own Traces tab lists them whatever their time.

So the run's description links the experiment's Traces view over the eval's own window (its
first trace's start to its last trace's start, widened to whole minutes), and an export of an
eval already outside the default view says where its traces are.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from urllib.parse import urlencode

DEFAULT_VIEW_DAYS = 7  # MLflow's default time range of its experiment pages (LAST_7_DAYS)
MINUTE_MS = 60_000


@dataclass(frozen=True)
class TraceWindow:
    """The traces one export logged: how many, and their first and last start (epoch ms)."""

    traces: int
    first_ms: int
    last_ms: int

    def path(self, experiment_id: str) -> str:
        """The UI route (after the server's URL) of the experiment's Traces view over this window."""
        start = self.first_ms // MINUTE_MS * MINUTE_MS
        end = -(-(self.last_ms + 1) // MINUTE_MS) * MINUTE_MS  # the next whole minute after the last
        fields = {"startTimeLabel": "CUSTOM", "startTime": _iso(start), "endTime": _iso(end)}
        query = urlencode(fields, safe=":")
        return f"#/experiments/{experiment_id}/traces?{query}"

    def description(self, experiment_id: str) -> str:
        """A Markdown paragraph for the run's description: the link, and why it is there."""
        return (
            f"Traces: [{self.traces} traces]({self.path(experiment_id)}), from {_day(self.first_ms)} "
            f"(the experiment's Traces view shows the last {DEFAULT_VIEW_DAYS} days unless a time "
            "range is chosen; this run's Traces tab lists them always)"
        )

    def note(self, experiment_id: str, now_s: float | None = None) -> str | None:
        """What the export's result says when some traces start before MLflow's default view."""
        now_ms = (time.time() if now_s is None else now_s) * 1000
        if self.first_ms >= now_ms - DEFAULT_VIEW_DAYS * 86_400_000:
            return None
        return (
            f"traces from {_day(self.first_ms)}, before MLflow's default 'Last {DEFAULT_VIEW_DAYS} days' "
            f"view: the run's Traces tab, or {self.path(experiment_id)} (linked in the run's description)"
        )


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d")
