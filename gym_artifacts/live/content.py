"""What a live run logged, as the content identities an export computes from the run's files.

A live run that ends FINISHED records in each backend's marker the identity of its metrics
journal and of the rollouts it sent (a multiset digest of their canonical records, the digest
``identity`` gives ``OUT.jsonl``), and of NeMo Gym's failures sidecar as it was when the run
ended (None: there was none). ``gym-artifacts export`` then knows from content, without an
explicit ``complete()``, that the files it exports are this live run's: same journal, same
rollouts, the same failures (``export.certify.content_refusal``); a failure added to the sidecar
since is one the live run never saw. An aggregate written after teardown changes none of them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gym_artifacts.run.artifacts import FAILURES, METRICS_JOURNAL, ROLLOUTS


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
            for record in records:  # the eval's thread: never a wait for the GIL (issue 40)
                self._digest.add_record_bytes(record, keep_gil=True)

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


def logged_content(
    journal_fpath: Path, rollouts: LoggedRollouts, failures_fpath: Path | None
) -> dict[str, str | None] | None:
    """``{artifact name: identity}`` of what the live run logged, and of the failures sidecar
    (``failures_fpath``, None: the run has none, as the export sees it) as it is now; None when
    it cannot be told."""
    from gym_artifacts.run.identity import jsonl_digest

    sent = rollouts.identity()
    if sent is None:
        return None
    try:
        journal = journal_identity(journal_fpath)
        failures = jsonl_digest(failures_fpath).hexdigest() if failures_fpath is not None else None
    except Exception:
        return None
    return {METRICS_JOURNAL: journal, ROLLOUTS: sent, FAILURES: failures}
