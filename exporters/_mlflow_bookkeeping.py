"""The exporter's bookkeeping on an MLflow run: one tag, ``gym_artifacts``, holding a JSON object.

What the exporter records for itself (the run's content identity and send key, the export
attempt, completion, certification, where the run's times came from, coverage, why the NVML
summary is missing...) is kept in one tag, so that MLflow's run overview shows MLflow's own tags
(``mlflow.*``), the user's configured tags and this one line, not a dozen bookkeeping rows. The
value is canonical JSON (sorted keys, no spaces): a run is found by a ``LIKE`` filter on the
exact ``"key":"value"`` text, which every MLflow store (SQL databases and servers) supports,
and each hit's parsed object is checked exactly (``LIKE`` is only a prefilter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

BOOKKEEPING_TAG = "gym_artifacts"
MAX_TAG_VALUE = 8000  # MLflow's MAX_TAG_VAL_LENGTH
# Looked-up values are digests, uuids and flags: nothing a LIKE pattern or a quoted filter string
# could read as more than itself ('%' and '_' are wildcards, quotes end the string).
_LOOKUP_VALUE = re.compile(r"[A-Za-z0-9.:\-]+")
# Never shortened to fit the tag: the values runs are found and judged by.
_KEPT_WHOLE = frozenset(
    {"identity", "bytes_digest", "export_attempt", "complete", "certified", "superseded_by"}
)


def bookkeeping_of(tags: Mapping[str, str]) -> dict[str, str]:
    """The bookkeeping a run's tags hold (``{}`` when the tag is missing or not a JSON object)."""
    raw = tags.get(BOOKKEEPING_TAG)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def encode(entries: Mapping[str, str]) -> str:
    """The tag's value: canonical JSON, free-text entries shortened until it fits MLflow's limit."""
    fitted = {k: str(v) for k, v in entries.items()}
    while len(text := _canonical(fitted)) > MAX_TAG_VALUE:
        free = [k for k in fitted if k not in _KEPT_WHOLE and len(fitted[k]) > 16]
        if not free:
            raise ValueError(f"MLflow bookkeeping tag of {len(text)} characters cannot be shortened")
        longest = max(free, key=lambda k: len(fitted[k]))
        fitted[longest] = fitted[longest][: len(fitted[longest]) // 2] + "..."
    return text


def lookup_filter(key: str, value: str) -> str:
    """An MLflow search filter that matches (at least) the runs whose bookkeeping has
    ``key == value``. A value outside digests/uuids/flags is refused (ValueError): a ``%``,
    ``_`` or quote would widen the ``LIKE`` pattern or end the filter's string. Our own keys
    hold ``_`` (``bytes_digest``), which in ``LIKE`` matches any one character: that only
    widens the prefilter, whose hits are checked exactly."""
    if not _LOOKUP_VALUE.fullmatch(value) or not _LOOKUP_VALUE.fullmatch(key.replace("_", "-")):
        raise ValueError(
            f"MLflow bookkeeping lookup refuses {key}={value!r}: only letters, digits, '.', ':', '-'"
        )
    needle = _canonical({key: value})[1:-1]  # "key":"value", exactly as encode() writes it
    return f"tags.`{BOOKKEEPING_TAG}` LIKE '%{needle}%'"


def _canonical(entries: Mapping[str, str]) -> str:
    return json.dumps(dict(entries), sort_keys=True, separators=(",", ":"))
