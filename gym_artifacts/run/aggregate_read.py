"""NeMo Gym's aggregate metrics file read once per export, in memory that does not grow with its
tasks and rollouts.

NeMo Gym 0.7 writes one JSON document with, per agent, its bounded statistics and the per-task
(``group_level_metrics``, each with every repeat's ``rollout_infos``) and per-repeat levels: about
50 MB for 100,000 rollouts, held at three times that size when parsed whole, by each of the
checks, the coverage, the payload and the report that read it. ``read_aggregate`` streams it
instead (``core.json_stream``): each agent's head (everything but its level lists) is kept, and
each level item becomes a table row written to a temporary file as it is read, the file's
rows read back one at a time by whoever sends the table (``SpooledRows``). A small file, and one
the stream cannot read exactly (NaN, integers past 64 bits, a repeated level key, malformed), is
read whole: the same result, and a malformed file's usual error.

One read serves every reader of the same unchanged file in this process (``_CACHE``: the file's
device, inode, size and times), so an export reads the document once.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, overload

import orjson

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.flatten import Scalar
from gym_artifacts.core.jsonio import metric_value
from gym_artifacts.run.levels import LEVEL_INDEX, LevelTable, agent_labels, level_tables, row_of

WHAT = "aggregate metrics JSON"


@dataclass(frozen=True)
class AggregateRead:
    """What readers take from the aggregate metrics file."""

    heads: list[dict[str, Any]]
    """Each agent's entry without its per-task and per-repeat lists (values, labels, errors)."""
    tables: list[LevelTable]
    """The per-task and per-repeat levels (``aggregate.level_tables``), rows on disk when streamed."""
    expected_rollouts: int | None
    """The sum of the groups' ``expected_num_rollouts`` (None when no group states one)."""


class SpooledRows(Sequence[list[Scalar]]):
    """A level table's rows in an anonymous temporary file, read back one at a time on each
    iteration. Each iteration reads at its own offsets (``os.pread``), so backends sending at once
    do not share a position; the file has no name, so nothing is left behind, even by a killed
    process, and it goes when the last reference (``redacted`` copies share it) goes."""

    def __init__(
        self,
        spool: _Spool,
        count: int,
        columns: list[str],
        labels: list[str],
        secrets: frozenset[str] = frozenset(),
        *,
        redact: bool | None = None,
    ) -> None:
        self._spool = spool
        self._count = count
        self._columns = columns
        self._labels = labels
        self._secrets = secrets
        self._redact = bool(secrets) if redact is None else redact

    def redacted(self, secrets: frozenset[str]) -> SpooledRows:
        """The same rows with ``secrets`` and the process's known secrets
        (``redact_secret_values``) redacted from their text cells as they are read."""
        return SpooledRows(
            self._spool, self._count, self._columns, self._labels, self._secrets | secrets, redact=True
        )

    def __len__(self) -> int:
        return self._count

    def _lines(self) -> Iterator[bytes]:
        fd, offset, tail = self._spool.file.fileno(), 0, b""
        while block := os.pread(fd, _READ_BYTES, offset):
            offset += len(block)
            lines = (tail + block).split(b"\n")
            tail = lines.pop()
            yield from lines
        if tail:
            yield tail

    def __iter__(self) -> Iterator[list[Scalar]]:
        from gym_artifacts.core.secrets import redact_secret_values, secret_forms_as_bytes

        columns, labels, secrets, redact = self._columns, self._labels, self._secrets, self._redact
        if redact:  # no cell searched when neither these nor the known secrets hold any value
            forms = secret_forms_as_bytes(secrets)
            redact = forms is None or bool(forms)
        for line in self._lines():
            entry, record = orjson.loads(line)
            if entry is not None:
                record["agent"] = labels[entry]
            row = [record.get(c) for c in columns]
            if redact:
                row = [redact_secret_values(c, secrets) if isinstance(c, str) else c for c in row]
            yield row

    @overload
    def __getitem__(self, index: int) -> list[Scalar]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[Scalar]]: ...
    def __getitem__(self, index: int | slice) -> list[Scalar] | list[list[Scalar]]:
        """A row or rows by position: read through from the start (iterate instead)."""
        import itertools

        if isinstance(index, slice):
            return list(itertools.islice(self, *index.indices(self._count)))
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return next(itertools.islice(self, index, None))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SpooledRows({self._count} rows on disk)"


_READ_BYTES = 1 << 20


class _Spool:
    """An anonymous temporary file, closed when the last holder goes (rows and their copies)."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="gymart-level-")  # noqa: SIM115
        weakref.finalize(self, self.file.close)


class _LevelSpool:
    """One level's rows as they are read: ``[entry, row]`` JSON lines (``entry`` None when the
    item names its own ``agent``), columns in first-seen order."""

    def __init__(self, level: str) -> None:
        self.level = level
        self.index_key = LEVEL_INDEX[level]
        self._spool = _Spool()
        self.columns: dict[str, None] = {}
        self.count = 0

    def add(self, entry: int, item: Any) -> None:
        row = row_of("", self.index_key, item)
        self.columns.update(dict.fromkeys(row))
        own_agent = isinstance(item, dict) and "agent" in item  # the item's own field wins, as in row_of
        self._spool.file.write(orjson.dumps([None if own_agent else entry, row]) + b"\n")
        self.count += 1

    def close(self) -> None:
        """Flush what was written (the rows read it back by descriptor); closed with its rows."""
        self._spool.file.flush()

    def discard(self) -> None:
        self._spool.file.close()

    def table(self, labels: list[str]) -> LevelTable:
        self.close()
        columns = list(self.columns)
        rows = SpooledRows(self._spool, self.count, list(columns), labels)  # its own column list
        return LevelTable(self.level, self.index_key, columns, rows)


def _expected(group: Any) -> int | None:
    """A group's ``expected_num_rollouts`` (None when it states none a count can be made of:
    absent, text, NaN or infinite)."""
    value = metric_value(group.get("expected_num_rollouts")) if isinstance(group, dict) else None
    return int(value) if value is not None and math.isfinite(value) else None


def _streamed(fpath: Path) -> AggregateRead:
    """``read_aggregate`` as a stream; ``NotStreamable`` when it must be read whole."""

    spools = {level: _LevelSpool(level) for level in LEVEL_INDEX}
    try:
        read = _read_into(fpath, spools)
    except BaseException:
        for spool in spools.values():
            spool.discard()
        raise
    for level, spool in spools.items():
        if not any(t.name == level for t in read.tables):
            spool.discard()  # no rows: nothing reads it
    return read


def _read_into(fpath: Path, spools: dict[str, _LevelSpool]) -> AggregateRead:
    from gym_artifacts.core.json_stream import NotStreamable, build_value, json_events

    heads: list[dict[str, Any]] = []
    expected = [0, False]
    events = json_events(fpath, WHAT)
    if next(events, (None, None))[0] != "start_array":
        raise NotStreamable("not a list")
    for event, _ in events:
        if event == "end_array":
            break
        if event != "start_map":
            raise NotStreamable("an entry that is not an object")
        head: dict[str, Any] = {}
        levels_seen: set[str] = set()
        for event, key in events:
            if event == "end_map":
                break
            if key in levels_seen:
                raise NotStreamable(f"{key} given twice in one entry")
            first = next(events)
            if key not in LEVEL_INDEX or first[0] not in ("start_array", "start_map"):
                head[key] = build_value(events, first)
                continue
            levels_seen.add(key)
            head.pop(key, None)
            items = _items(events, first)
            for item in items:
                spools[key].add(len(heads), item)
                if key == "group_level_metrics" and first[0] == "start_array":
                    value = _expected(item)
                    if value is not None:
                        expected[0] += value
                        expected[1] = True
        heads.append(head)
    for _ in events:  # only white space may follow: ijson raises on anything else
        raise NotStreamable("data after the list")
    labels = agent_labels(heads)
    tables = [s.table(labels) for s in spools.values() if s.count]
    return AggregateRead(heads, tables, int(expected[0]) if expected[1] else None)


def _items(events: Iterator[tuple[str, Any]], first: tuple[str, Any]) -> Iterator[Any]:
    """A level's items: each item of its list, or the one object of a pre-0.7 shape."""
    from gym_artifacts.core.json_stream import build_value

    if first[0] == "start_map":
        yield build_value(events, first)
        return
    for event in events:
        if event[0] == "end_array":
            return
        yield build_value(events, event)


def _whole(entries: list[dict[str, Any]]) -> AggregateRead:
    heads = [
        {k: v for k, v in e.items() if not (k in LEVEL_INDEX and isinstance(v, dict | list))} for e in entries
    ]
    total, found = 0, False
    for entry in entries:
        groups = entry.get("group_level_metrics")
        for group in groups if isinstance(groups, list) else []:
            value = _expected(group)
            if value is not None:
                total, found = total + value, True
    return AggregateRead(heads, level_tables(entries), total if found else None)


_CACHE: dict[Path, tuple[tuple[int, ...], AggregateRead]] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 2


def _stat_key(fpath: Path) -> tuple[int, ...]:
    st = os.stat(fpath)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _unchanged(fpath: Path, key: tuple[int, ...]) -> bool:
    """Whether the file is still the one read (False when it has gone since: the read stands,
    for this reader only)."""
    try:
        return _stat_key(fpath) == key
    except OSError:
        return False


def read_aggregate(fpath: Path, *, stream: bool | None = None) -> AggregateRead:
    """The aggregate metrics file at ``fpath`` as readers take it (RunError when it is not NeMo
    Gym's format: a list of per-agent objects). ``stream``: force the streamed (True) or whole
    (False) read; by default a file of ``STREAMED_JSON_MIN_BYTES`` or more is streamed."""
    from gym_artifacts.core.json_stream import STREAMED_JSON_MIN_BYTES, NotStreamable

    try:
        key = _stat_key(fpath)
    except OSError as exc:
        raise RunError(f"{fpath}: cannot read {WHAT}: {exc.strerror or exc}") from exc
    with _CACHE_LOCK:
        cached = _CACHE.get(fpath)
        if cached is not None and cached[0] == key and stream is None:
            return _own_copy(cached[1])
        if stream is None:
            stream = key[2] >= STREAMED_JSON_MIN_BYTES
        result = None
        if stream:
            with contextlib.suppress(NotStreamable, OSError):  # OSError: no spool (TMPDIR full)
                result = _streamed(fpath)
        if result is None:
            result = _whole(read_entries(fpath))
        if _unchanged(fpath, key):  # others may share it
            _CACHE[fpath] = (key, result)
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
        return _own_copy(result)


def _own_copy(read: AggregateRead) -> AggregateRead:
    """A copy of a shared read that its reader may edit (each reader parsed its own before the
    cache): the heads (small) deep, a table's columns and in-memory rows (cells are scalars);
    spooled rows are read anew on each iteration already."""
    import copy
    from dataclasses import replace

    tables = [replace(t, columns=list(t.columns), rows=_rows_copy(t.rows)) for t in read.tables]
    return AggregateRead(copy.deepcopy(read.heads), tables, read.expected_rollouts)


def _rows_copy(rows: Sequence[list[Scalar]]) -> Sequence[list[Scalar]]:
    return [list(r) for r in rows] if isinstance(rows, list) else rows


def read_entries(fpath: Path) -> list[dict[str, Any]]:
    """The whole document, checked to be NeMo Gym's format (a list of objects)."""
    from gym_artifacts.core.jsonio import read_json

    data = read_json(fpath, WHAT)
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise RunError(
            f"{fpath}: aggregate metrics must be a JSON list of per-agent objects (NeMo Gym format)"
        )
    return data
