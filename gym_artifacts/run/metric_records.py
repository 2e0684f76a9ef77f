"""A queued metric call as one object the garbage collector never walks.

Live metric calls wait in the workers' queues (up to 100,000 of them behind a slow or dead
backend). Held as tuples and dicts, every full collection of the cyclic garbage collector would
walk each of them, in whichever thread crossed the allocation threshold: often the eval's own
``export_metrics`` call. So a call is queued as a *record*: the ``(metrics, step, time)`` triple
encoded once, in the caller's thread, with :mod:`marshal` into a ``bytes`` object (not a
container: a collection does not walk it, and it never counts towards the next full collection).
The fan-out encodes once and hands the same record to the journal and to every backend; each
worker decodes it when it applies it.

:mod:`marshal` is fast (well under a microsecond for a few metrics) but silently writes any
object with the buffer protocol (numpy scalars among them) as ``bytes``, so only plain values
are encoded: ``str`` keys and ``float``/``int``/``bool``/``str``/``None`` values, an ``int`` (or
no) step. Anything else (numpy or torch scalars, nested values) is queued as the plain tuple it
always was: correct, just not free for the collector. Records are only ever decoded by the
process that encoded them, never read from a file or a peer.
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping
from typing import Any

# One queued metric call: marshal bytes, or the plain (metrics, step, time) tuple for odd values.
MetricRecord = bytes | tuple[dict[str, Any], int | None, float]
MetricEntry = tuple[dict[str, Any], int | None, float]

_PLAIN_VALUES = frozenset({float, int, bool, str, type(None)})
_PLAIN_KEYS = frozenset({str})
_MARSHAL_VERSION = 2  # no back-references: faster to write, and nothing here repeats


def encode_record(metrics: Mapping[str, Any], step: int | None, when: float) -> MetricRecord:
    """The call as one record; a private snapshot of ``metrics`` either way."""
    snapshot = dict(metrics)
    if (
        (step is None or type(step) is int)
        and type(when) is float
        and _PLAIN_KEYS.issuperset(map(type, snapshot))
        and _PLAIN_VALUES.issuperset(map(type, snapshot.values()))
    ):
        return marshal.dumps((snapshot, step, when), _MARSHAL_VERSION)
    return (snapshot, step, when)


def decode_record(record: MetricRecord) -> MetricEntry:
    """The ``(metrics, step, time)`` a record holds; a fresh dict for each decode."""
    if type(record) is bytes:
        return marshal.loads(record)  # type: ignore[no-any-return]
    return record  # type: ignore[return-value]


def is_record(item: object) -> bool:
    """Whether a queue item is a metric record (``Call`` and markers are other types)."""
    kind = type(item)
    return kind is bytes or kind is tuple
