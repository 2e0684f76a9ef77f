"""Time limits that hold on a loaded machine: a wait a test allows, scaled by the load measured
when it is asked for (the 1-minute load average per core, never less than 1).

A test bounds what it waits for (a hang must fail, not block) but never asserts an absolute
time: on a 2-core machine under load 8-16 every subprocess start and import takes several times
longer, so a fixed 10 s becomes a false failure. ``scaled(10)`` is 10 s on an idle machine and
40 s at a load of 8 on 2 cores; ``LOAD_CAP`` keeps a runaway load from making it unbounded."""

from __future__ import annotations

import os

LOAD_CAP = 8.0  # never more than 8 times the idle limit


def load_factor() -> float:
    """The 1-minute load average per core, at least 1 and at most ``LOAD_CAP``."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system
        return 1.0
    return min(LOAD_CAP, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, longer in proportion to the load now."""
    return seconds * load_factor()
