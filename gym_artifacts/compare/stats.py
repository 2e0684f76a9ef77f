"""The paired test of two runs on one metric, as NeMo Gym's ``nemo_gym/statistical_tests/`` does it.

Method (NeMo Gym main, ``paired_test.py`` / ``paired_t_test.py``; after Evan Miller, "Adding
Error Bars to Evals", arXiv:2411.00640, "Resampling" and "Paired analysis"):

1. Each run's rollouts of one task are collapsed to one mean per task (``pairing.py`` reads
   NeMo Gym's per-task ``mean/<metric>``; here the same mean is taken from the rollouts).
2. Only tasks with a value in both runs are paired; ``d_i = candidate_i - base_i``.
3. ``mean = sum(d) / n``, ``se = sqrt(sum((d - mean)^2) / (n - 1)) / sqrt(n)``. The mean of
   independent per-task deltas is near normal by the central limit theorem even though the
   deltas are not: Student's t with ``n - 1`` degrees of freedom approximates it.
4. Two framings, chosen by whether a margin is given:

   - two-sided (no margin): H0 ``mu_d = 0`` vs H1 ``mu_d != 0``; ``t = mean / se``,
     ``p = 2 * sf(|t|, n - 1)``; significant means "a real difference".
   - one-sided non-inferiority (margin ``m >= 0``): H0 ``mu_d <= -m`` vs H1 ``mu_d > -m``;
     ``t = (mean + m) / se``, ``p = sf(t, n - 1)``; significant means "the candidate is not
     worse than the base by more than ``m``".

   ``significant = p < alpha``.
5. The minimum detectable effect at 80 % power:
   ``(t.ppf(1 - tail_alpha, n - 1) + t.ppf(0.8, n - 1)) * se`` with ``tail_alpha = alpha / 2``
   (two-sided) or ``alpha`` (non-inferiority).
6. Degenerate cases, as NeMo Gym: no pair (no p-value), one pair (the mean only: no standard
   error from one point), fewer pairs than half of the larger run's tasks (too little overlap to
   conclude; NeMo Gym main's ``MIN_PAIRED_COVERAGE``), and every delta equal (``se < 1e-12``:
   the verdict is read from the mean itself with the same tolerance, ``p`` is 0 or 1).

This module adds the interval NeMo Gym does not print, from the same t distribution so that it
always agrees with the p-value: two-sided, the ``1 - alpha`` interval ``mean +- t(1 - alpha/2) se``
(it excludes 0 exactly when ``p < alpha``); non-inferiority, the ``1 - 2 alpha`` interval
``mean +- t(1 - alpha) se`` whose lower end is the one-sided ``1 - alpha`` bound (it lies above
``-m`` exactly when ``p < alpha``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gym_artifacts.core.errors import GymArtifactsError

MDE_POWER = 0.8  # the power the minimum detectable effect is quoted at
EPS = 1e-12  # differences this small are float64 rounding noise, not signal
MIN_PAIRED_COVERAGE = 0.5  # below this share of the larger run's tasks, nothing is concluded
DEFAULT_ALPHA = 0.05  # the significance level when none is given


@dataclass(frozen=True)
class PairedResult:
    """One metric's paired test; ``p_value`` None when the data cannot support one (see ``note``)."""

    metric: str
    framing: str  # "two-sided" or "non-inferiority"
    alpha: float
    margin: float | None
    n_pairs: int
    mean_diff: float | None = None
    se: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    t_stat: float | None = None
    p_value: float | None = None
    significant: bool | None = None
    minimum_detectable_effect: float | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_alpha_margin(alpha: float, margin: float | None) -> None:
    """ValueError for an alpha outside (0, 1) or a negative or non-finite margin."""
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and 0 < alpha < 1):
        raise ValueError(f"alpha must be between 0 and 1 (got {alpha!r})")
    if margin is not None and not (isinstance(margin, int | float) and math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite number >= 0 (got {margin!r})")
    if margin is not None and alpha >= 0.5:
        raise ValueError(f"with a margin (one-sided), alpha must be below 0.5 (got {alpha!r})")


NOT_COMPUTABLE = "not computable: the values exceed float64's range (about 1.8e308)"


def mean_and_se(deltas: Sequence[float]) -> tuple[int, float | None, float | None]:
    """``(n, mean, standard error)``; the error is None below two deltas.

    Any finite deltas: when the plain sums overflow (values near 1e308), they are taken again
    scaled by the largest magnitude, so the mean is always finite; the standard error is None
    when it exceeds float64 itself (``finite_stats`` then reports it as not computable).
    """
    n = len(deltas)
    if n == 0:
        return 0, None, None
    try:
        mean = math.fsum(deltas) / n
        variance = math.fsum((d - mean) * (d - mean) for d in deltas) / (n - 1) if n > 1 else 0.0
    except OverflowError:  # fsum's intermediate overflow: the scaled path below
        mean = variance = math.inf
    if not (math.isfinite(mean) and math.isfinite(variance)):
        scale = max(abs(d) for d in deltas)
        scaled = [d / scale for d in deltas]
        unit_mean = math.fsum(scaled) / n
        mean = unit_mean * scale
        unit_var = math.fsum((x - unit_mean) ** 2 for x in scaled) / (n - 1) if n > 1 else 0.0
        se_unit = math.sqrt(unit_var) / math.sqrt(n)
        se = se_unit * scale if se_unit <= 1 or scale <= sys.float_info.max / se_unit else math.inf
        return n, mean, (se if n > 1 and math.isfinite(se) else None)
    if n < 2:
        return n, mean, None
    return n, mean, math.sqrt(variance) / math.sqrt(n)


def finite(*values: float | None) -> bool:
    """Every given value is a finite number (None counts as absent, not as a failure)."""
    return all(v is None or math.isfinite(v) for v in values)


def paired_test(
    deltas: Sequence[float],
    *,
    metric: str,
    alpha: float = DEFAULT_ALPHA,
    margin: float | None = None,
    tasks_in_larger_run: int | None = None,
) -> PairedResult:
    """The paired test of ``deltas`` (candidate - base, one per paired task); see the module doc.

    ``tasks_in_larger_run``: how many tasks the run with more of them holds (NeMo Gym main's
    overlap rule); None skips that rule.
    """
    check_alpha_margin(alpha, margin)
    stats = scipy_stats()
    framing = "two-sided" if margin is None else "non-inferiority"
    base = {"metric": metric, "framing": framing, "alpha": alpha, "margin": margin}
    if any(not math.isfinite(d) for d in deltas):  # a difference of two finite values overflowed
        return PairedResult(
            **base, n_pairs=len(deltas), note=f"{NOT_COMPUTABLE}: a per-task difference overflows"
        )
    n, mean, se = mean_and_se(deltas)
    if n == 0:
        return PairedResult(**base, n_pairs=0, note="no task has this metric in both runs: nothing to pair")
    if tasks_in_larger_run is not None and n < MIN_PAIRED_COVERAGE * tasks_in_larger_run:
        return PairedResult(**base, n_pairs=n, mean_diff=mean, note=(
            f"only {n} of {tasks_in_larger_run} tasks paired: too little overlap to draw a conclusion"
        ))  # fmt: skip
    if n < 2:
        return PairedResult(**base, n_pairs=n, mean_diff=mean,
                            note="only 1 paired task: a standard error needs at least 2")  # fmt: skip
    if se is None:
        return PairedResult(**base, n_pairs=n, mean_diff=mean, note=f"{NOT_COMPUTABLE}: the standard error")
    threshold = 0.0 if margin is None else -margin
    if se < EPS:
        significant = abs(mean) > EPS if margin is None else mean - threshold > EPS
        return PairedResult(
            **base, n_pairs=n, mean_diff=mean, se=0.0, ci_low=mean, ci_high=mean,
            ci_level=_ci_level(alpha, margin), p_value=0.0 if significant else 1.0, significant=significant,
            note="every paired delta is the same (zero variance): the verdict is read from the mean itself",
        )  # fmt: skip
    df = n - 1
    tail_alpha = alpha / 2 if margin is None else alpha
    if margin is None:
        t_stat = mean / se
        p_value = float(2 * stats.t.sf(abs(t_stat), df))
    else:
        t_stat = (mean + margin) / se
        p_value = float(stats.t.sf(t_stat, df))
    half = float(stats.t.ppf(1 - tail_alpha, df)) * se
    mde = (float(stats.t.ppf(1 - tail_alpha, df)) + float(stats.t.ppf(MDE_POWER, df))) * se
    if not finite(mean - half, mean + half, mde):
        return PairedResult(**base, n_pairs=n, mean_diff=mean, note=f"{NOT_COMPUTABLE}: the interval")
    return PairedResult(
        **base, n_pairs=n, mean_diff=mean, se=se, ci_low=mean - half, ci_high=mean + half,
        ci_level=_ci_level(alpha, margin), t_stat=float(t_stat) if math.isfinite(t_stat) else None,
        p_value=p_value, significant=p_value < alpha, minimum_detectable_effect=mde,
    )  # fmt: skip


def scipy_stats() -> Any:
    """scipy.stats (the ``compare`` extra), or MissingScipy saying how to install it."""
    try:
        from scipy import stats
    except ImportError as exc:
        raise MissingScipy(
            "gym-artifacts compare needs scipy for Student's t distribution: "
            "pip install 'gym-artifacts[compare]'"
        ) from exc
    return stats


class MissingScipy(GymArtifactsError):
    """scipy is not installed (the ``compare`` extra)."""


def _ci_level(alpha: float, margin: float | None) -> float:
    return 1 - alpha if margin is None else 1 - 2 * alpha
