"""One read of a JSONL file for everything an export needs of it (issue 43).

A cold export used to read a run's rollouts several times: the send key's bytes and line count,
the identity workers' parse, ``params_from_files``. Here one sequential read gives them all: the
bytes are hashed with blake3 (the send key's digest) and their lines counted as they are read,
and the same bytes, cut at line ends into blocks of a shared memory buffer, are parsed once for
the multiset identity of the records and, for the rollouts, the params they tell
(``ParamsTally``). A large file's blocks are parsed by worker processes forked here (they read
the shared buffer, never the file); a small one's in this process. Memory is a few blocks,
whatever the file's size.

The products are kept in the identity cache under the file's stat key: a second command on the
unchanged run reads nothing (``cached_params``).
"""

from __future__ import annotations

import atexit
import marshal
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import blake3

from gym_artifacts.core.jsonio import open_regular, record_and_canonical
from gym_artifacts.run.digests import JsonlDigest, LineCounter, hex_digest
from gym_artifacts.run.nemo_gym_params import ParamsTally
from gym_artifacts.run.rollout_values import row_values
from gym_artifacts.run.rollouts_table import RolloutsTable
from gym_artifacts.run.trajectory import rollout_window

BLOCK = 4 << 20  # a block of the shared buffer: a line longer than this is read the old way
# The identity cache's entries for what the rollouts tell (beside their identity's)
FACTS_ENTRY = "facts:"


class LineTooLong(Exception):
    """A line longer than a block: the file is read by the separate passes instead."""


@dataclass
class JsonlRead:
    """What one read of a JSONL file gave: its bytes' digest and non-blank lines (the send
    key's), its records' multiset digest up to ``end`` (its identity), and, for the rollouts,
    what they tell of the run (``facts``: None for other files)."""

    bytes_digest: str
    lines: int
    records: JsonlDigest
    facts: RolloutFacts | None
    # with ``rows``: each record's values in line order (``RowValues``); the caller closes it
    rows: RowValues | None = None
    # with ``table``: NeMo Gym's table of the complete lines (``RolloutsTable``); the caller closes it
    table: RolloutsTable | None = None


class RowValues:
    """Each record's ``rollout_values.row_values`` in line order, spooled to an anonymous file
    (a few dozen bytes a row) and read back a block at a time: memory constant in rows."""

    def __init__(self, spool: IO[bytes], count: int) -> None:
        self._spool, self.count = spool, count

    def __iter__(self) -> Iterator[tuple[list[tuple[str, float]], float | None]]:
        self._spool.seek(0)
        while header := self._spool.read(8):
            yield from marshal.loads(self._spool.read(int.from_bytes(header, "big")))

    def close(self) -> None:
        self._spool.close()


class RolloutFacts:
    """What rollouts tell of their run, tallied a record at a time (parts of a file merge): the
    params (``ParamsTally``) and the time window (the earliest start and latest end of
    ``trajectory.rollout_window``, what ``times.run_times`` falls back on)."""

    __slots__ = ("first", "last", "params")

    def __init__(self) -> None:
        self.params = ParamsTally()
        self.first: float | None = None
        self.last: float | None = None

    def add(self, row: Any, terminated: bool = True) -> None:
        """One record; an unterminated last line tells no params (``params_from_files`` stops
        before it) but its times count (``times`` reads it)."""
        if terminated:
            self.params.add(row)
        start, end = rollout_window(row)
        if start is not None:
            self._widen(start, end if end is not None else start)

    def _widen(self, start: float, end: float) -> None:
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)

    def merge(self, other: RolloutFacts) -> None:
        self.params.merge(other.params)
        if other.first is not None and other.last is not None:
            self._widen(other.first, other.last)

    def as_json(self) -> dict[str, Any]:
        """What the identity cache keeps: ``{"params": ..., "window": [start, end] | None}``."""
        window = None if self.first is None or self.last is None else [self.first, self.last]
        return {"params": self.params.params(), "window": window}


class _Records:
    """The parse of whole lines: the multiset digest and, for the rollouts, their facts and
    (``rows``) each row's values (``rollout_values.row_values``) in line order."""

    def __init__(self, fpath: Path, tally: bool, rows: bool = False) -> None:
        self.fpath = fpath
        self.digest = JsonlDigest()
        self.tally = RolloutFacts() if tally else None
        self.rows: list[Any] | None = [] if rows else None

    def take_rows(self) -> bytes | None:
        """The rows' values added since the last call, marshalled (None without ``rows``)."""
        if self.rows is None:
            return None
        taken, self.rows = marshal.dumps(self.rows), []
        return taken

    def feed(self, block: bytes, terminated: bool = True) -> None:
        """Records of ``block``'s lines (``terminated``: its last line ends with a newline; else
        it is the file's own unterminated last line, see ``RolloutFacts.add``)."""
        lines = block.split(b"\n")
        last = len(lines) - 1
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            value, canonical = record_and_canonical(raw, self.fpath, 0)
            self.digest.add_record_bytes(canonical)
            if self.tally is not None:
                self.tally.add(value, terminated or i < last)
            if self.rows is not None:
                self.rows.append(row_values(value))


# The buffer a pool's workers parse from: set before they are forked, so every worker maps it.
_SHARED: mmap.mmap | None = None


def _parse_block(
    fpath: str, tally: bool, rows: bool, start: int, length: int
) -> tuple[int, int, RolloutFacts | None, bytes | None]:
    """In a worker: the records of one block of the shared buffer, as mergeable parts (and
    its rows' values, marshalled, to be written in block order)."""
    assert _SHARED is not None
    records = _Records(Path(fpath), tally, rows)
    records.feed(_SHARED[start : start + length])
    return records.digest.count, records.digest.total, records.tally, records.take_rows()


def _workers() -> int:
    return min(os.cpu_count() or 1, 8)


class _Parsers:
    """Where blocks are parsed: in this process, or by forked workers reading the shared buffer
    (each block's slot is reused once its worker is done with it)."""

    def __init__(
        self, fpath: Path, tally: bool, parallel: bool, rows: bool = False, table: bool = False
    ) -> None:
        import tempfile

        self.records = _Records(fpath, tally, rows)
        # written here, in block order, from the bytes the reader holds: no worker sends them back
        self.table = RolloutsTable() if table else None
        self.fpath, self.tally, self.rows = fpath, tally, rows
        # each block's rows' values, in block order: a length, then the marshalled list
        self.spool = tempfile.TemporaryFile(prefix="gym-artifacts-rows-") if rows else None  # noqa: SIM115
        workers = _workers()
        # forked only while this is the only thread (as the identity's workers are)
        self.parallel = parallel and workers >= 2 and threading.active_count() == 1
        self.slots = workers + 2 if self.parallel else 1  # a block for each worker, one filling, one spare
        self.buffer = mmap.mmap(-1, self.slots * BLOCK)
        self.pending: list[tuple[int, Future[Any]] | None] = [None] * self.slots
        self._pool: Any = None
        if self.parallel:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            global _SHARED
            _SHARED = self.buffer
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))

    def slot(self, i: int) -> int:
        """The offset of slot ``i`` once it is free."""
        self._collect(i)
        return (i % self.slots) * BLOCK

    def parse(self, i: int, start: int, length: int, terminated: bool = True) -> None:
        if not length:
            return
        if self.table is not None and terminated:  # a table holds complete lines only
            self.table.feed(self.buffer[start : start + length])
        if self._pool is None or not terminated:
            self._drain()  # the blocks before this one are written first
            self.records.feed(self.buffer[start : start + length], terminated)
            self._write_rows(self.records.take_rows())
            return
        job = self._pool.submit(_parse_block, str(self.fpath), self.tally, self.rows, start, length)
        self.pending[i % self.slots] = i, job

    def _collect(self, i: int) -> None:
        pending, self.pending[i % self.slots] = self.pending[i % self.slots], None
        if pending is None:
            return
        count, total, tally, rows = pending[1].result()
        self.records.digest.merge(JsonlDigest(count, total))
        if tally is not None and self.records.tally is not None:
            self.records.tally.merge(tally)
        self._write_rows(rows)

    def _write_rows(self, rows: bytes | None) -> None:
        if rows is not None and self.spool is not None:
            self.spool.write(len(rows).to_bytes(8, "big"))
            self.spool.write(rows)

    def _drain(self) -> None:
        """Every block handed to a worker, collected in block order."""
        for _, i in sorted((p[0], n) for n, p in enumerate(self.pending) if p is not None):
            self._collect(i)

    def finish(self) -> _Records:
        self._drain()
        return self.records

    def close(self, keep_rows: bool = False) -> None:
        global _SHARED
        if self.spool is not None and not keep_rows:
            self.spool.close()
        if self.table is not None and not (keep_rows and self.table.finish()):
            self.table.close()
            self.table = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            _SHARED = None
        self.buffer.close()


def read_jsonl_once(
    fpath: Path,
    end: int | None = None,
    *,
    tally: bool = False,
    parallel: bool = False,
    rows: bool = False,
    table: bool = False,
) -> JsonlRead:
    """One read of ``fpath``: bytes digest and line count of the whole file, records' digest
    (and, with ``tally``, what they tell of the run) of the lines before ``end`` (a torn last line
    left out); ``parallel``: blocks parsed by forked workers (where there are cores and no other
    thread). RunError for a malformed line (its line number is not known here: the caller reads
    the file again in order to name it); LineTooLong for a line longer than a block. ``rows``:
    each record's values too (``JsonlRead.rows``); ``table``: NeMo Gym's table of its complete
    lines (``JsonlRead.table``; None when a line is not UTF-8)."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    unparsed = LineCounter()  # the lines past ``end``: each parsed non-blank line is a record
    parsers = _Parsers(fpath, tally, parallel, rows, table)
    done = False
    try:
        with open_regular(fpath) as fh:
            records = _read(fh, parsers, hasher.update, unparsed, end)
        done = True
    finally:
        parsers.close(keep_rows=done)
    lines = records.digest.count + unparsed.count
    values = RowValues(parsers.spool, records.digest.count) if parsers.spool is not None else None
    return JsonlRead(hex_digest(hasher), lines, records.digest, records.tally, values, parsers.table)


def _read(
    fh: Any, parsers: _Parsers, hash_bytes: Callable[[Any], object], unparsed: LineCounter, end: int | None
) -> _Records:
    buf = parsers.buffer
    view = memoryview(buf)
    try:
        carry = b""  # the start of a line the last block ended inside
        parsed = 0  # the file offset the next block starts at
        i = 0
        while True:
            base = parsers.slot(i)
            buf[base : base + len(carry)] = carry
            n = fh.readinto(view[base + len(carry) : base + BLOCK])
            hash_bytes(view[base + len(carry) : base + len(carry) + n])
            filled = len(carry) + n
            if n == 0:  # end of file: an unterminated last line, unless it is the torn one left out
                if end is None or parsed < end:
                    parsers.parse(i, base, len(carry), terminated=False)
                else:
                    unparsed.feed(carry)
                return parsers.finish()
            newline = buf.rfind(b"\n", base, base + filled)
            if newline < 0:
                if filled == BLOCK:
                    raise LineTooLong(f"a line of {parsers.fpath} is longer than {BLOCK >> 20} MiB")
                carry = buf[base : base + filled]
                continue
            complete = newline + 1 - base
            length = complete if end is None else max(0, min(complete, end - parsed))
            if length:
                parsers.parse(i, base, length)
            if length < complete:
                unparsed.feed(buf[base + length : base + complete])
            carry = buf[base + complete : base + filled]
            parsed += complete
            i += 1
    finally:
        view.release()


# What the last rollouts read in this process tell, by path and stat key: what a file too
# recently written for the identity cache (its racy window) still answers from.
_LAST_FACTS: dict[str, tuple[list[int], dict[str, Any]]] = {}


def remember_facts(fpath: Path, key: list[int], facts: dict[str, Any]) -> None:
    """Keep the facts (``RolloutFacts.as_json``) just read from ``fpath`` (stat key ``key``)."""
    _LAST_FACTS.clear()
    _LAST_FACTS[str(fpath)] = key, facts


@dataclass
class ReadProducts:
    """What the one read of the rollouts made for this export's backends (each None unless a
    backend asked): the rows' values (``Exporter.reads_row_values``) and NeMo Gym's table
    (``ships_rollouts_table``). Kept until the export ends, then closed."""

    rows: RowValues | None = None
    table: RolloutsTable | None = None

    def close(self) -> None:
        for product in (self.rows, self.table):
            if product is not None:
                product.close()


_KEPT: dict[str, tuple[list[int], ReadProducts]] = {}  # by path: exports of other runs in threads
_KEPT_LOCK = threading.Lock()
_KEPT_AT_EXIT: list[bool] = []


def remember_products(fpath: Path, key: list[int], products: ReadProducts) -> None:
    """Keep what the read of ``fpath`` (stat key ``key``) made for a backend of this export
    (``rollouts_facts.rollout_row_values``, ``rollouts_facts.rollouts_table``), until
    ``forget_products(fpath)``; those of an earlier read of the same file are let go."""
    forget_products(fpath)
    with _KEPT_LOCK:
        if not _KEPT_AT_EXIT:
            atexit.register(forget_products)
            _KEPT_AT_EXIT.append(True)
        _KEPT[str(fpath)] = key, products


def forget_products(fpath: Path | None = None) -> None:
    """Let go of what was kept for ``fpath`` (every file's: None), its files closed: the export
    that read them is over."""
    with _KEPT_LOCK:
        names = list(_KEPT) if fpath is None else [str(fpath)]
        kept = [_KEPT.pop(name, None) for name in names]
    for entry in kept:
        if entry is not None:
            entry[1].close()


def remembered_products(fpath: Path, key: list[int]) -> ReadProducts | None:
    """What this process's last read of ``fpath`` made, when the file is as it was."""
    with _KEPT_LOCK:
        remembered = _KEPT.get(str(fpath))
    return remembered[1] if remembered is not None and remembered[0] == key else None


def remembered_facts(fpath: Path, key: list[int]) -> dict[str, Any] | None:
    """The facts this process last read from ``fpath`` when it is as it was (stat key ``key``)."""
    remembered = _LAST_FACTS.get(str(fpath))
    return remembered[1] if remembered is not None and remembered[0] == key else None
