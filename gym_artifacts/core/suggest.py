""""Did you mean": the one place that picks the closest known word to a typo.

Used for unknown commands, options and choices on the command line, exporter names and config
keys, so every refusal suggests the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's similarity ratio below which a guess would mislead more than help


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known word closest to ``word``, or None when none is close."""
    matches = difflib.get_close_matches(word, sorted(set(known)), n=1, cutoff=CUTOFF)
    return matches[0] if matches else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` for the closest known word, "" when none is close."""
    guess = closest(word, known)
    return f"; did you mean {guess!r}?" if guess is not None else ""
