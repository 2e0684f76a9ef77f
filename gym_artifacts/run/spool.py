"""Live rollouts kept in a temporary JSONL file until a backend sends them whole at teardown.

A backend whose SDK takes rollouts as one upload (an MLflow artifact, a W&B table) spools them
here instead of holding them in a list: memory stays flat however many arrive, and what the
backend sends at teardown is one file it can upload as is or read back record by record.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gym_artifacts.core.jsonio import canonical_json, iter_jsonl


class RolloutSpool:
    """Append-only rollouts on disk (one canonical JSON line each); ``discard`` removes them."""

    def __init__(self, name: str = "rollouts.jsonl", prefix: str = "gym-artifacts-spool-") -> None:
        self.name = name
        self.prefix = prefix
        self.rows = 0
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._fh: IO[bytes] | None = None

    @property
    def path(self) -> Path | None:
        """The spool file, once anything was appended."""
        return Path(self._dir.name) / self.name if self._dir is not None else None

    def append(self, rollouts: list[Any]) -> None:
        """Write these rollouts (flushed to the OS, so a reader sees every complete line)."""
        if self._fh is None:
            self._dir = tempfile.TemporaryDirectory(prefix=self.prefix)
            self._fh = open(Path(self._dir.name) / self.name, "ab")  # noqa: SIM115 - closed in finish/discard
        self._fh.write(b"".join(canonical_json(r) + b"\n" for r in rollouts))
        self._fh.flush()
        self.rows += len(rollouts)

    def finish(self) -> Path | None:
        """Close the file and return it (None when nothing was spooled); it lives until ``discard``."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        return self.path

    def records(self) -> Iterator[Any]:
        """The spooled rollouts, read back one at a time."""
        path = self.finish()
        if path is not None:
            yield from (record for _, record in iter_jsonl(path, "spooled rollouts"))

    def discard(self) -> None:
        """Forget everything spooled (the temporary folder is removed)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self.rows = 0
