"""Which process of a distributed job owns telemetry: only rank 0 opens exporters and producers."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _rank_from_env(var: str) -> int:
    value = os.environ.get(var)
    if value is None or value.strip() == "":
        return 0
    try:
        return int(value.strip())
    except ValueError:
        if var not in _warned:
            _warned.add(var)
            logger.warning("%s=%r is not an integer; reading it as rank 0", var, value)
        return 0


def is_rank_zero() -> bool:
    """True unless ``RANK`` or ``LOCAL_RANK`` names another rank (malformed values read as 0)."""
    return _rank_from_env("RANK") == 0 and _rank_from_env("LOCAL_RANK") == 0
