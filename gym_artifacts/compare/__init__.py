"""Compare finished runs: is the candidate better than the base, on which tasks, how sure are we.

``compare_runs(base, candidates)`` pairs rollouts by task and runs NeMo Gym's paired test per
metric (``stats``); ``build_compare_page`` writes the offline page; ``gym-artifacts compare``
is the command (``cli``); ``--log`` sends it to the trackers once (``log``).
"""

from __future__ import annotations

from gym_artifacts.compare.comparison import CompareError, Comparison, compare_runs

__all__ = ["CompareError", "Comparison", "compare_runs"]
