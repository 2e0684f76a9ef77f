"""A streaming histogram in TensorBoard's own bucket scheme (pure Python, no SDK).

TensorFlow's legacy ``HistogramProto`` buckets: limits at +-1e-12 * 1.1**k up to 1e20, zero,
and a last bucket up to the largest double. Every value lands in the first bucket whose limit
is above it, so counts are exact and memory is constant in the number of values (a run of a
million rollouts costs the same ~1,500 counters as one of ten). TensorBoard's histogram and
distribution dashboards read this form directly.
"""

from __future__ import annotations

import bisect
import math
import operator
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial


def _default_limits() -> list[float]:
    positive = []
    v = 1e-12
    while v < 1e20:
        positive.append(v)
        v *= 1.1
    return [-x for x in reversed(positive)] + [0.0] + positive + [sys.float_info.max]


LIMITS = _default_limits()


@dataclass
class Histogram:
    """Counts of finite values per bucket of ``LIMITS``, with their min, max, sum and sum of squares."""

    num: int = 0
    sum: float = 0.0
    sum_squares: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    counts: dict[int, int] = field(default_factory=dict)

    def extend(self, values: Iterable[float]) -> Histogram:
        """Add many values at once: the per-value work runs in C (``bisect``, ``Counter``, ``sum``)."""
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return self
        last = len(LIMITS) - 1
        for index, count in Counter(map(partial(bisect.bisect_right, LIMITS), finite)).items():
            index = min(index, last)
            self.counts[index] = self.counts.get(index, 0) + count
        self.num += len(finite)
        self.sum += math.fsum(finite)
        self.sum_squares += math.fsum(map(operator.mul, finite, finite))
        self.min = min(self.min, min(finite))
        self.max = max(self.max, max(finite))
        return self

    def buckets(self) -> tuple[list[float], list[float]]:
        """``(bucket_limit, bucket)`` as the proto wants them: the non-empty buckets, and for
        each run of empty ones only its last (so every bucket's lower edge stays the previous
        limit), as TensorFlow's encoder does."""
        limits: list[float] = []
        counts: list[float] = []
        previous = -1
        for index in sorted(self.counts):
            if index > previous + 1:  # an empty run before this bucket: keep its last limit
                limits.append(LIMITS[index - 1])
                counts.append(0.0)
            limits.append(LIMITS[index])
            counts.append(float(self.counts[index]))
            previous = index
        return limits, counts
