"""What a live run logged, as the content identities an export computes from the run's files.

A live run that ends FINISHED records in each backend's marker the identity of its metrics
journal and of the rollouts it sent (a multiset digest of their canonical records, the digest
``identity`` gives ``OUT.jsonl``). ``gym-artifacts export`` then knows from content, without an
explicit ``complete()``, that the files it exports are this live run's: same journal, same
rollouts (``export.certify.content_refusal``). An aggregate written after teardown changes neither.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gym_artifacts.run.artifacts import METRICS_JOURNAL, ROLLOUTS


class LoggedRollouts:
    """A running multiset digest of the rollouts a live run sent (thread-safe).

    A rollout that cannot be encoded as JSON makes the digest unknown (None): the run's content
    then cannot be matched and an export sends a new run, as before.
    """

    def __init__(self) -> None:
        from gym_artifacts.run.identity import JsonlDigest

        self._digest: JsonlDigest | None = JsonlDigest()
        self._lock = threading.Lock()

    def add(self, rollouts: list[Any]) -> None:
        """Add one batch; never raises."""
        try:
            import orjson

            from gym_artifacts.core.jsonio import canonical_record

            records = [
                canonical_record(orjson.dumps(r), "<live rollouts>", i + 1) for i, r in enumerate(rollouts)
            ]
        except Exception:
            records = None
        with self._lock:
            if self._digest is None:
                return
            if records is None:
                self._digest = None
                return
            for record in records:
                self._digest.add_record_bytes(record)

    def identity(self) -> str | None:
        with self._lock:
            return self._digest.hexdigest() if self._digest is not None else None


def journal_identity(fpath: Path) -> str | None:
    """The journal's identity as an export computes it (None when the file is absent)."""
    from gym_artifacts.run.identity import jsonl_digest
    from gym_artifacts.run.torn import partial_last_line

    if not fpath.exists():
        return None
    torn = partial_last_line(fpath)
    return jsonl_digest(fpath, end=torn.complete_bytes if torn else None).hexdigest()


def logged_content(journal_fpath: Path, rollouts: LoggedRollouts) -> dict[str, str | None] | None:
    """``{artifact name: identity}`` of what the live run logged; None when it cannot be told."""
    sent = rollouts.identity()
    if sent is None:
        return None
    try:
        journal = journal_identity(journal_fpath)
    except Exception:
        return None
    return {METRICS_JOURNAL: journal, ROLLOUTS: sent}
