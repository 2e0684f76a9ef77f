"""Summary statistics of a metric series: average, peak, p50, p95, in bounded memory.

Values are kept exactly up to ``capacity``; past it a uniform reservoir sample of that size
stands in for the percentiles (average, peak and count stay exact).
"""

from __future__ import annotations

import math
import random
from array import array


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not sorted_values:
        raise ValueError("percentile of an empty series")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return sorted_values[lo]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class SeriesStats:
    """Streaming statistics of one metric on one device."""

    __slots__ = ("_rng", "_values", "capacity", "count", "peak", "total")

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self.count = 0
        self.total = 0.0
        self.peak = -math.inf
        self._values = array("d")
        self._rng = random.Random(0)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.peak = max(self.peak, value)
        if len(self._values) < self.capacity:
            self._values.append(value)
        else:
            slot = self._rng.randrange(self.count)
            if slot < self.capacity:
                self._values[slot] = value

    def summary(self) -> dict[str, float]:
        ordered = sorted(self._values)
        return {
            "avg": self.total / self.count,
            "peak": self.peak,
            "p50": percentile(ordered, 50),
            "p95": percentile(ordered, 95),
            "samples": self.count,
        }
