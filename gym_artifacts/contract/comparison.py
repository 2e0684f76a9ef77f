"""What a backend receives for a comparison of finished runs (``gym-artifacts compare --log``).

A backend with a place for a comparison implements the optional hook
``PostRunHooks._export_comparison(comparison)``; the core decides once per destination, with the
export's own receipts, whether to call it (``gym_artifacts.compare.log``). Everything here is
plain data, already masked; no SDK is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Table = tuple[list[str], list[list[Any]]]  # (columns, rows); every cell None, bool, int, float or str


@dataclass(frozen=True)
class ComparisonPayload:
    """One comparison: who was compared (content identities), what it found, and the page.

    ``identity`` is the comparison's exactly-once key (a hash of every run's content identity and
    the test's settings): a backend finds an earlier send of it by this key (a lost receipt never
    makes a second run). ``note`` is the verdict, one line per candidate, whole: a backend that
    limits a description's length says where the rest went, never cuts it silently.
    """

    identity: str
    base_identity: str
    candidate_identities: tuple[str, ...]
    settings: dict[str, Any]
    name: str
    base_run: str
    candidate_runs: tuple[str, ...]
    framing: str
    note: str
    verdict: str | None  # the policy's overall verdict (PASS / WARN / FAIL / INCONCLUSIVE), if any
    tables: dict[str, Table]  # "compare_results", "compare_tasks" (and "compare_gate" with a policy)
    metrics: dict[str, float]  # "<metric>/mean_diff" (prefixed by the candidate when several), finite
    page: Path
    secrets: frozenset[str] = field(default_factory=frozenset)
