"""How much of a run's planned work its files hold, from NeMo Gym's own signals.

Signals, strongest first: the materialized inputs (``OUT_materialized_inputs.jsonl``: every
input NeMo Gym dispatched, the denominator), the rollouts (``OUT.jsonl``: the scored rollouts),
the failures sidecar (``OUT_failures.jsonl``: rollouts that failed and were routed aside) and
the aggregate's per-task ``expected_num_rollouts`` / ``missing_num_rollouts``. From them:

- ``coverage/expected``: planned rollouts (materialized inputs; else the aggregate's expected
  counts; unknown when neither exists),
- ``coverage/scored``: rollouts in ``OUT.jsonl``,
- ``coverage/failed``: rows of the failures sidecar (this project's addition),
- ``coverage/missing``: planned rollouts with no result at all (neither scored nor failed), so
  ``scored + failed + missing = expected``. NeMo Gym's own ``coverage/missing`` (its step
  metric) is ``expected - scored``, failed rollouts included; shown beside ``coverage/failed``
  that read as every failure lost twice. Without a failures sidecar both are the same number.
  NeMo Gym's own figures are restated to this definition wherever they pass (``nemo_gym_coverage``):
  the live drop-in (``gym_artifacts.nemo_gym.export_metrics``, with the failures sidecar as it is
  then) and the journal's points a post-run export sends (``RunPayload.journal``), so every
  backend, the report and the journal agree.

The export rule (README, "Partial runs"): a run whose every planned rollout is accounted for
(scored or recorded as failed) is exported, and marked partial when any failed; a run with
planned rollouts that are neither scored nor failed is unfinished and refused, unless an
acceptance record ``STEM_acceptance.json`` accepts at least that many omitted rows, which is
the explicit "accepted partial" path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.jsonio import attributes_json, count_lines

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts

ROLLOUTS_NAME = "rollouts.jsonl"
FAILURES_NAME = "failures.jsonl"
INPUTS_NAME = "materialized_inputs.jsonl"


@dataclass(frozen=True)
class Coverage:
    """Planned, scored and failed rollouts of one run, and what they mean for its export."""

    scored: int
    expected: int | None
    expected_source: str | None
    failed: int | None
    accepted_omitted: int | None

    @property
    def not_scored(self) -> int | None:
        """Planned rollouts not in the rollouts file (failed or never finished): NeMo Gym's own
        ``coverage/missing``."""
        return None if self.expected is None else max(self.expected - self.scored, 0)

    @property
    def missing(self) -> int | None:
        """Planned rollouts with no result at all (``unaccounted``): scored + failed + missing =
        expected."""
        return None if self.expected is None else self.unaccounted

    @property
    def unaccounted(self) -> int:
        """Planned rollouts that are neither scored nor recorded as failed."""
        if self.expected is None:
            return 0
        return max(self.expected - self.scored - (self.failed or 0), 0)

    @property
    def partial(self) -> bool:
        return bool(self.not_scored)

    def metrics(self) -> dict[str, float]:
        """Tracker metrics under NeMo Gym's ``coverage/*`` names (plus ``coverage/failed``) that
        add up: ``scored + failed + missing = expected`` (the module doc)."""
        out = {"coverage/scored": float(self.scored)}
        if self.expected is not None:
            out["coverage/expected"] = float(self.expected)
            out["coverage/missing"] = float(self.unaccounted)
        if self.failed is not None:
            out["coverage/failed"] = float(self.failed)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            **attributes_json(
                self,
                "expected expected_from=expected_source scored failed missing unaccounted partial"
                " accepted_omitted_rows=accepted_omitted",
            ),
            "text": self.text(),
        }

    def text(self) -> str:
        """One line for people: ``8 of 10 planned rollouts scored (2 failed) - partial``."""
        if self.expected is None:
            return f"{self.scored} rollouts scored (planned count unknown: no materialized inputs)"
        line = f"{self.scored} of {self.expected} planned rollouts scored"
        notes = []
        if self.failed:
            notes.append(f"{self.failed} failed")
        if self.unaccounted:
            notes.append(f"{self.unaccounted} with no result")
        if notes:
            line += " (" + ", ".join(notes) + ")"
        if self.partial:
            line += " - accepted partial" if self.accepted_omitted is not None else " - partial"
        return line

    def refusal(self) -> str | None:
        """Why the run must not be exported as it is, or None."""
        if not self.unaccounted:
            return None
        if self.accepted_omitted is not None and self.accepted_omitted >= self.unaccounted:
            return None
        return (
            f"{self.unaccounted} of {self.expected} planned rollouts have no result (neither in the "
            "rollouts nor in the failures sidecar): the run is unfinished. Resume it, or export it "
            "as an accepted partial by writing STEM_acceptance.json with omitted_rows >= "
            f"{self.unaccounted}"
        )


def _count(value: Any) -> int | None:
    """A count as NeMo Gym logs one (an int, or a float holding one), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 0 else None


def nemo_gym_coverage(metrics: Mapping[str, Any], failed: int | None) -> dict[str, float] | None:
    """NeMo Gym's own end-of-collection figures (``coverage/expected``, ``coverage/scored``,
    ``coverage/missing`` = expected - scored) restated under this module's one definition, with
    ``failed`` rows of the failures sidecar (None: no sidecar, missing stays expected - scored):
    the ``coverage/*`` values ``Coverage.metrics`` gives. None when ``metrics`` hold no
    ``coverage/missing`` beside countable expected and scored figures (nothing to restate)."""
    if "coverage/missing" not in metrics:
        return None
    expected, scored = _count(metrics.get("coverage/expected")), _count(metrics.get("coverage/scored"))
    if expected is None or scored is None:
        return None
    return Coverage(scored, expected, None, failed, None).metrics()


def coverage_of(run: RunArtifacts, record_counts: dict[str, int] | None = None) -> Coverage:
    """The run's coverage; ``record_counts`` (from the identity pass) saves re-reading files."""
    counts = record_counts or {}

    def records(name: str, fpath: Any) -> int | None:
        if name in counts:
            return counts[name]
        if fpath is None or not fpath.is_file():
            return None
        return count_lines(fpath)

    scored = records(ROLLOUTS_NAME, run.rollouts_fpath) or 0
    failed = records(FAILURES_NAME, run.failures_fpath)
    expected = records(INPUTS_NAME, run.materialized_inputs_fpath)
    source = "materialized inputs" if expected is not None else None
    if expected is None and run.has_rollouts_file and run.aggregate_metrics_fpath.is_file():
        from gym_artifacts.core.errors import RunError

        try:
            expected = run.read_aggregate().expected_rollouts
        except RunError:
            expected = None
        if expected is not None:
            # The aggregate only knows tasks that produced a rollout; failed ones were planned too.
            expected = max(expected, scored + (failed or 0))
            source = "aggregate metrics"
    acceptance = run.read_acceptance()
    return Coverage(
        scored=scored,
        expected=expected,
        expected_source=source,
        failed=failed,
        accepted_omitted=acceptance.omitted_rows if acceptance is not None else None,
    )
