"""Which process of a distributed job owns telemetry: only rank 0 opens exporters and producers.

The rank comes from ``set_rank`` when the caller knows it (a launcher this library cannot see),
else from the environment: a process is rank 0 unless ``RANK`` (torchrun), ``LOCAL_RANK`` or
``SLURM_PROCID`` (srun) names another rank. A malformed value reads as 0, with one warning.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)
_warned: set[str] = set()

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID")

_override: int | None = None


def set_rank(rank: int | None) -> None:
    """Declare this process's global rank (0 owns telemetry); ``None`` reads the environment again."""
    global _override
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be a non-negative integer or None, not {rank!r}")
    _override = rank


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
    """True for the rank ``set_rank`` declared 0, else unless a rank variable names another rank."""
    if _override is not None:
        return _override == 0
    return all(_rank_from_env(var) == 0 for var in RANK_VARIABLES)
