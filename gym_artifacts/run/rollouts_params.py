"""The params a run's rollouts tell (``params_from_files``), from the export's one read of them.

The read that computes the rollouts' identity (``identity.send_key`` through ``jsonl_pass``) also
tallies agent, environment, model and repeats, and records the params in the identity cache
under the file's stat key (and in this process's memory, for a file too new for the cache):
asked for the params of the file as it is now, nothing is read again.
"""

from __future__ import annotations

import os
from typing import Any

from gym_artifacts.run.artifacts import ROLLOUTS, RunArtifacts
from gym_artifacts.run.identity import IdentityCache, stat_key
from gym_artifacts.run.jsonl_pass import PARAMS_ENTRY, remembered_params
from gym_artifacts.run.nemo_gym_params import params_from_files


def cached_params(run: RunArtifacts) -> tuple[bool, dict[str, Any] | None]:
    """``(True, params)`` when the one read of the run's rollouts recorded their params for the
    file as it is now (in this process, or in the identity cache), else ``(False, None)``."""
    fpath = run.rollouts_fpath
    if fpath is None:
        return False, None
    try:
        key = stat_key(os.stat(fpath))
    except OSError:
        return False, None
    found, params = remembered_params(fpath, key)
    if not found:
        found, params = IdentityCache(run.identity_cache_fpath).lookup_product(PARAMS_ENTRY + ROLLOUTS, key)
    return found, params if found and isinstance(params, dict) else None


def run_params(run: RunArtifacts) -> dict[str, Any] | None:
    """The params the run's rollouts tell: from their one read when it recorded them, else read."""
    found, params = cached_params(run)
    return params if found else params_from_files(run)
