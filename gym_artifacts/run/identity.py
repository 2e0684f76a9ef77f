"""Content identities: digests of what a run's files say, independent of how and where they sit.

JSON and YAML are hashed in canonical form, JSONL as an order-independent multiset of canonical
records, gzip by its decompressed bytes, anything else by its bytes. Paths and file times never
enter a digest: only artifact names relative to the run are used, as dictionary keys.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.jsonio import (
    canonical_json,
    canonical_record,
    open_regular,
    read_json,
    read_line,
    read_regular_bytes,
    read_yaml,
)
from gym_artifacts.run.artifacts import METRICS_JOURNAL, ROLLOUTS
from gym_artifacts.run.digests import PREFIX as PREFIX
from gym_artifacts.run.digests import JsonlDigest, LineCounter
from gym_artifacts.run.digests import hex_digest as _hex
from gym_artifacts.run.torn import partial_last_line

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts

_CHUNK = 1 << 20
# An identity computed this export: ``(stat key, identity)``, or with the file's record count.
Known = tuple[list[int], str] | tuple[list[int], str, int]


_BYTES_BUFFER = 8 << 20


def hash_bytes_file(fpath: Path, lines: LineCounter | None = None) -> str:
    """Digest of the file's bytes, read through one fixed buffer and hashed on every core;
    ``lines``, when given, counts the file's non-blank lines from the same read.

    Streaming rather than memory-mapping keeps the resident set constant in the file's size.
    """
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    buffer = bytearray(_BYTES_BUFFER)
    view = memoryview(buffer)
    with open_regular(fpath) as fh:
        while n := fh.readinto(buffer):
            hasher.update(view[:n])
            if lines is not None:
                lines.feed(buffer if n == len(buffer) else bytes(view[:n]))
    return _hex(hasher)


def hash_gzip_file(fpath: Path) -> str:
    """Digest of the decompressed bytes: the gzip header's time and name do not count."""
    hasher = blake3.blake3()
    try:
        with gzip.open(fpath, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                hasher.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise RunError(f"{fpath}: not a readable gzip file: {exc}") from exc
    return _hex(hasher)


def hash_json_file(fpath: Path) -> str:
    """Digest of the canonical form (sorted keys, no insignificant white space). A file of
    ``STREAMED_JSON_MIN_BYTES`` or more is canonicalised as a stream (the same bytes, in memory
    that does not grow with the document: NeMo Gym's aggregate metrics file holds every
    rollout's infos); one the stream cannot read exactly is parsed whole."""
    from gym_artifacts.core.json_stream import STREAMED_JSON_MIN_BYTES, NotStreamable, canonical_digest

    if os.stat(fpath).st_size >= STREAMED_JSON_MIN_BYTES:
        hasher = blake3.blake3()
        try:
            canonical_digest(fpath, hasher.update)
            return _hex(hasher)
        except (NotStreamable, OSError):  # OSError: no temporary file for a large member
            pass
    return _hex(blake3.blake3(canonical_json(read_json(fpath))))


def hash_yaml_file(fpath: Path) -> str:
    """Digest of the canonical form of the YAML content, interpolations as written."""
    return _hex(blake3.blake3(canonical_json(read_yaml(fpath))))


def digest_jsonl_range(fpath: Path, start: int = 0, end: int | None = None) -> JsonlDigest:
    """Multiset digest of the records whose lines start within ``[start, end)`` of the file."""
    acc = JsonlDigest()
    with open_regular(fpath) as fh:
        if start:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # the line that straddles ``start`` belongs to the previous range
        lineno = None if start else 0
        while end is None or fh.tell() < end:
            raw = read_line(fh, fpath, (lineno or 0) + 1)
            if not raw:
                break
            if lineno is not None:
                lineno += 1
            if not raw.strip():
                continue
            acc.add_record_bytes(canonical_record(raw, fpath, lineno if lineno is not None else 0))
    return acc


PARALLEL_MIN_BYTES = 64 << 20


def _digest_range_job(job: tuple[str, int, int]) -> tuple[int, int]:
    fpath, start, end = job
    part = digest_jsonl_range(Path(fpath), start, end)
    return part.count, part.total


def hash_jsonl_file(fpath: Path, workers: int | None = None) -> str:
    """Order-independent digest of the file's records (formatting does not count)."""
    return jsonl_digest(fpath, workers).hexdigest()


def jsonl_digest(fpath: Path, workers: int | None = None, end: int | None = None) -> JsonlDigest:
    """The file's multiset digest (its record count included); ``end`` leaves out a torn tail.

    A large file is split at line boundaries and its parts hashed in parallel processes; the
    multiset sums merge. A malformed line is reported with its line number either way.
    """
    size = fpath.stat().st_size if end is None else end
    workers = workers or _workers()
    if size < PARALLEL_MIN_BYTES or workers < 2:
        return digest_jsonl_range(fpath, 0, end)
    return JsonlInFlight(fpath, end, workers).result()


def _workers() -> int:
    return min(os.cpu_count() or 1, 8)


class JsonlInFlight:
    """A large JSONL file's multiset digest, its parts hashed by worker processes started now
    (split at line boundaries; the multiset sums merge in ``result()``).

    Started by the thread that will go on sending, while it is the only thread, the workers are
    forked (cheap); where other threads run, they come from a fresh fork server instead.
    """

    def __init__(self, fpath: Path, end: int | None = None, workers: int | None = None) -> None:
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor

        self.fpath, self.end = fpath, end
        size = fpath.stat().st_size if end is None else end
        workers = max(2, workers or _workers())
        method = "fork" if threading.active_count() == 1 else "forkserver"
        bounds = [size * i // workers for i in range(workers + 1)]
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method))
        # with fork, every worker is forked here, by the first submit, before the pool's own thread
        jobs = [(str(fpath), bounds[i], bounds[i + 1]) for i in range(workers)]
        self._parts = [self._pool.submit(_digest_range_job, job) for job in jobs]

    def result(self) -> JsonlDigest:
        """The merged digest; a malformed line is reported with its line number."""
        try:
            parts = [part.result() for part in self._parts]
        except RunError:
            return digest_jsonl_range(self.fpath, 0, self.end)  # again in order, for the line number
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        total = JsonlDigest()
        for count, part_sum in parts:
            total.merge(JsonlDigest(count, part_sum))
        return total


# A JSON or YAML document is identified by its canonical form (formatting does not count) only
# up to this size; a bigger one by its bytes, streamed in constant memory. (Kept for the
# identities already recorded: a JSON file is canonicalised as a stream now, see hash_json_file.)
CANONICAL_MAX_BYTES = 64 << 20


def identity_kind(fpath: Path, size: int | None = None) -> str:
    """How a file's content identity is computed: ``jsonl``, ``json``, ``yaml``, ``gzip`` (parsed
    or decompressed) or ``bytes`` (its bytes as they are), by its name's ending and size."""
    name = fpath.name.lower()
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith((".json", ".yaml", ".yml")):
        size = fpath.stat().st_size if size is None else size
        if size > CANONICAL_MAX_BYTES:
            return "bytes"  # too big to parse whole: its bytes, streamed
        return "json" if name.endswith(".json") else "yaml"
    if name.endswith(".gz"):
        return "gzip"
    return "bytes"


def identity_of(fpath: Path) -> str:
    """The content identity of one file, chosen by its kind (``identity_kind``)."""
    kind = identity_kind(fpath)
    if kind == "jsonl":
        return hash_jsonl_file(fpath)
    if kind == "json":
        return hash_json_file(fpath)
    if kind == "yaml":
        return hash_yaml_file(fpath)
    if kind == "gzip":
        return hash_gzip_file(fpath)
    return hash_bytes_file(fpath)


def content_identities(
    run: RunArtifacts,
    *,
    use_cache: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
    record_counts: dict[str, int] | None = None,
    known: Mapping[str, Known] | None = None,
    started: Mapping[str, tuple[list[int], JsonlInFlight]] | None = None,
) -> dict[str, str]:
    """``{artifact name: digest}`` for every file of the run that is present.

    A file whose device, inode, size, modification and change times all equal those recorded
    when it was last hashed is not read again (see ``IdentityCache``); any other file is.
    ``record_counts``, when given, receives the number of records of each JSONL file known.
    ``known``: identities already computed this export (``{name: (stat_key, identity)}``, the
    send key's pass), used for a file whose stat key still matches; ``started``: JSONL digests
    already being computed (``IdentitiesInFlight``), likewise.
    """
    cache = IdentityCache(run.identity_cache_fpath) if use_cache else None
    identities: dict[str, str] = {}
    files = run.artifact_files()
    total = sum(os.stat(p).st_size for p in files.values()) if progress is not None else 0
    done = 0
    for name, fpath in files.items():
        try:
            before = os.stat(fpath)
            if progress is not None:
                progress(f"hashing {name}", done, total)
                done += before.st_size
            cached = cache.lookup(name, before) if cache is not None else None
            fresh = cached is None
            if fresh and known is not None and name in known and known[name][0] == stat_key(before):
                entry = known[name]
                cached = entry[1], (entry[2] if len(entry) > 2 else None)
            if cached is not None:
                identities[name], records = cached
            elif name.endswith(".jsonl"):
                in_flight = started.get(name) if started is not None else None
                if in_flight is not None and in_flight[0] == stat_key(before):
                    digest = in_flight[1].result()
                else:
                    digest = jsonl_digest(fpath, end=_complete_bytes(name, fpath))
                identities[name], records = digest.hexdigest(), digest.count
            else:
                identities[name], records = identity_of(fpath), None
            if records is not None and record_counts is not None:
                record_counts[name] = records
            if fresh and cache is not None:
                cache.store(name, before, os.stat(fpath), identities[name], records)
        except OSError as exc:
            raise RunError(f"{fpath}: cannot read: {exc.strerror or exc}") from exc
    if cache is not None:
        cache.save()
    if progress is not None:
        progress("hashed", total, total)
    return identities


def _complete_bytes(name: str, fpath: Path) -> int | None:
    """Where a JSONL file's identity ends: before a torn last line of the rollouts or journal."""
    torn = partial_last_line(fpath) if name in (ROLLOUTS, METRICS_JOURNAL) else None
    return torn.complete_bytes if torn else None


def rollouts_with_failures_identity(run: RunArtifacts) -> str | None:
    """The multiset identity of the run's rollouts and its failed rollouts together (NeMo Gym's
    ``OUT_failures.jsonl`` with ``+route_failures_to_sidecar=true``): what the eval handed to
    ``export_rollouts`` live, every result, when its failures were routed aside. None when the
    run has no failures file."""
    from gym_artifacts.run.artifacts import FAILURES

    failures = run.sidecar_files().get(FAILURES)
    rollouts = run.rollouts_fpath
    if failures is None or rollouts is None or not rollouts.is_file():
        return None
    try:
        digest = jsonl_digest(rollouts, end=_complete_bytes(ROLLOUTS, rollouts))
        digest.merge(jsonl_digest(failures))
    except OSError as exc:
        raise RunError(
            f"cannot read the rollouts and failures of {run.source}: {exc.strerror or exc}"
        ) from exc
    return digest.hexdigest()


def stat_key(st: os.stat_result) -> list[int]:
    """What says a file is unchanged since it was last looked at: device, inode, size, mtime, ctime."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class IdentityCache:
    """Identities of a run's files keyed on (device, inode, size, mtime_ns, ctime_ns).

    ``ctime`` cannot be set by a writer, so a file rewritten with its old size and mtime still
    misses. A file whose modification time lies within ``RACY_NS`` of now, on either side (its
    timestamps may not yet tell two writes apart), or that changed while it was hashed is not
    cached. A modification time further in the future (a copy from a machine whose clock runs
    ahead) is cached like a past one: the next write sets the time to now, which differs, so a
    clock in the future costs one hash, not one per command. The cache is a hidden file beside
    the run; failing to write it only costs a rehash next time.
    """

    VERSION = 1
    RACY_NS = 1_000_000_000

    def __init__(self, fpath: Path) -> None:
        self.fpath = fpath
        self.entries: dict[str, dict[str, object]] = {}
        self.dirty = False
        try:
            data = json.loads(read_regular_bytes(fpath, "identity cache"))
            if (
                isinstance(data, dict)
                and data.get("version") == self.VERSION
                and isinstance(data.get("entries"), dict)
            ):
                self.entries = data["entries"]
        except (OSError, ValueError, RunError):  # a cache that is not ours (even a FIFO): ignored
            pass

    def lookup(self, name: str, st: os.stat_result) -> tuple[str, int | None] | None:
        """(identity, record count or None) when the file is unchanged since it was hashed."""
        entry = self.entries.get(name)
        if not isinstance(entry, dict) or entry.get("key") != stat_key(st):
            return None
        identity, records = entry.get("identity"), entry.get("records")
        if not isinstance(identity, str):
            return None
        return identity, records if isinstance(records, int) else None

    def lookup_product(self, name: str, key: list[int]) -> tuple[bool, Any]:
        """``(True, product)`` when a product of the file's one read (``store_product``) was
        recorded for it as it is now (stat key ``key``), else ``(False, None)``."""
        entry = self.entries.get(name)
        if not isinstance(entry, dict) or entry.get("key") != key or "product" not in entry:
            return False, None
        return True, entry["product"]

    def store_product(self, name: str, before: os.stat_result, after: os.stat_result, product: Any) -> None:
        """Record a JSON-able product of the file's read, under the same rules as an identity."""
        key = stat_key(before)
        if key != stat_key(after) or time.time_ns() - before.st_mtime_ns < self.RACY_NS:
            self.entries.pop(name, None)
        else:
            self.entries[name] = {"key": key, "product": product}
        self.dirty = True

    def store(
        self,
        name: str,
        before: os.stat_result,
        after: os.stat_result,
        identity: str,
        records: int | None = None,
    ) -> None:
        key = stat_key(before)
        if key != stat_key(after) or abs(time.time_ns() - before.st_mtime_ns) < self.RACY_NS:
            self.entries.pop(name, None)
            self.dirty = True
            return
        self.entries[name] = {"key": key, "identity": identity, "records": records}
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        from gym_artifacts.core.atomic import atomic_write_bytes

        with contextlib.suppress(OSError):
            atomic_write_bytes(
                self.fpath, json.dumps({"version": self.VERSION, "entries": self.entries}).encode()
            )


def run_identity(identities: Mapping[str, str]) -> str:
    """One digest for the whole run: what backends tag a run with to find it again."""
    hasher = blake3.blake3(b"run-identity-v1\0")
    hasher.update(canonical_json(dict(identities)))
    return _hex(hasher)


# -- hashing while sending ---------------------------------------------------------------------
# The content identity parses JSONL, JSON and YAML: on a large run it takes several times the copy
# or upload it guards. An export whose identities are not all in the cache computes them beside
# the send (``IdentitiesInFlight``) and tags the backend run with them last. What finds that
# backend run again after a crash, and what serialises two exports of the same files, must be
# known before the send: the send key.

SEND_KEY_PREFIX = "k3:"
# The identity cache's entries for the byte digests behind the send key.
_BYTES_ENTRY = "bytes:"


def send_key(
    run: RunArtifacts,
    record_counts: dict[str, int] | None = None,
    row_values: bool = False,
    table: bool = False,
) -> tuple[str, dict[str, Known]]:
    """A digest of every artifact's name and bytes, and the identities that came with it.

    The bytes are hashed with blake3 on every core (gigabytes a second: a small part of any copy
    of them), each file's digest cached by its stat key like an identity. The same bytes give the
    same key from any folder and after a ``touch``. A file whose identity is its bytes
    (``identity_kind`` ``bytes``: a recording, a trace) gets its identity from the same read:
    returned as ``{name: (stat_key, identity)}`` for ``content_identities(known=...)``; so does
    a JSONL file not in the cache, whose records are parsed from the same read (``jsonl_pass``:
    the rollouts' facts recorded too, and with ``row_values`` each row's values for a backend
    that asks, ``rollouts_facts.rollout_row_values``, and with ``table`` NeMo Gym's rollouts
    table, ``rollouts_facts.rollouts_table``).
    ``record_counts``, when given, receives each JSONL file's non-blank lines, counted from the
    same read (its records, unless its last line is torn).
    """
    cache = IdentityCache(run.identity_cache_fpath)
    digests: dict[str, str] = {}
    known: dict[str, Known] = {}
    for name, fpath in sorted(run.artifact_files().items()):
        try:
            before = os.stat(fpath)
            cached = cache.lookup(_BYTES_ENTRY + name, before)
            if cached is None and name.endswith(".jsonl") and cache.lookup(name, before) is None:
                read = _read_jsonl_once(run, cache, name, fpath, before, row_values, table)
                if read is not None:
                    cached, known[name] = read
            lines = LineCounter() if name.endswith(".jsonl") else None
            if cached is None:
                digest = hash_bytes_file(fpath, lines)
                counted = lines.count if lines is not None else None
                cache.store(_BYTES_ENTRY + name, before, os.stat(fpath), digest, counted)
            else:
                digest, counted = cached
            if counted is not None and record_counts is not None:
                record_counts[name] = counted
        except OSError as exc:
            raise RunError(f"{fpath}: cannot read: {exc.strerror or exc}") from exc
        digests[name] = digest
        if identity_kind(fpath, before.st_size) == "bytes":
            known[name] = (stat_key(before), digest)
    cache.save()
    hasher = blake3.blake3(b"send-key-v1\0")
    hasher.update(canonical_json(digests))
    return SEND_KEY_PREFIX + hasher.hexdigest(), known


def _read_jsonl_once(
    run: RunArtifacts,
    cache: IdentityCache,
    name: str,
    fpath: Path,
    before: os.stat_result,
    rows: bool = False,
    table: bool = False,
) -> tuple[tuple[str, int], Known] | None:
    """A JSONL file not in the cache, read once (``jsonl_pass``): its bytes digest and line
    count for the send key, and its identity (with its record count) as known for
    ``content_identities``; what the rollouts tell (params, times) recorded for
    ``rollouts_facts``. None when a line is too long for the one read's blocks (the file is then
    read by the separate passes)."""
    from gym_artifacts.run.jsonl_pass import (
        FACTS_ENTRY,
        LineTooLong,
        ReadProducts,
        read_jsonl_once,
        remember_facts,
        remember_products,
    )

    end = _complete_bytes(name, fpath)
    large = before.st_size >= PARALLEL_MIN_BYTES
    try:
        rollouts = name == ROLLOUTS
        read = read_jsonl_once(
            fpath, end, tally=rollouts, parallel=large, rows=rows and rollouts, table=table and rollouts
        )
    except LineTooLong:
        return None
    except RunError:
        digest_jsonl_range(fpath, 0, end)  # again in order: the error names the line
        raise
    after = os.stat(fpath)
    identity = read.records.hexdigest()
    cache.store(_BYTES_ENTRY + name, before, after, read.bytes_digest, read.lines)
    cache.store(name, before, after, identity, read.records.count)
    if read.facts is not None:
        facts = read.facts.as_json()
        cache.store_product(FACTS_ENTRY + name, before, after, facts)
        if stat_key(before) == stat_key(after):
            remember_facts(fpath, stat_key(before), facts)
    products = ReadProducts(read.rows, read.table)
    if products.rows is not None or products.table is not None:
        if stat_key(before) == stat_key(after):
            remember_products(fpath, stat_key(before), products)
        else:
            products.close()
    return (read.bytes_digest, read.lines), (stat_key(before), identity, read.records.count)


def identities_cached(run: RunArtifacts, known: Mapping[str, Known]) -> bool:
    """Whether every file's identity is known without reading it (cached, or from ``known``)."""
    cache = IdentityCache(run.identity_cache_fpath)
    for name, fpath in run.artifact_files().items():
        try:
            st = os.stat(fpath)
        except OSError:
            return False
        if name in known and known[name][0] == stat_key(st):
            continue
        if cache.lookup(name, st) is None:
            return False
    return True


class IdentitiesInFlight:
    """``content_identities`` of a run, started now and collected by ``result()``, while the
    caller sends the run.

    Each large JSONL file not in the cache is parsed and hashed by worker processes forked here,
    in the caller's thread (``JsonlInFlight``); a thread hashes the other files and collects the
    workers' parts. The send goes on in the caller's thread (a kernel copy, an upload) while the
    records are hashed on the other cores. ``result()`` waits and raises what the hashing raised.
    """

    def __init__(self, run: RunArtifacts, known: Mapping[str, Known] | None = None) -> None:
        import threading

        self._result: tuple[dict[str, str], str] | None = None
        self._error: BaseException | None = None
        started: dict[str, tuple[list[int], JsonlInFlight]] = {}
        cache = IdentityCache(run.identity_cache_fpath)
        try:
            for name, fpath in run.artifact_files().items():
                st = os.stat(fpath)
                large = name.endswith(".jsonl") and st.st_size >= PARALLEL_MIN_BYTES and _workers() >= 2
                if large and cache.lookup(name, st) is None:
                    started[name] = stat_key(st), JsonlInFlight(fpath, _complete_bytes(name, fpath))
        except (OSError, RunError):
            pass  # hashed (and reported) in order by the thread
        self._thread = threading.Thread(
            target=self._hash, args=(run, known, started), name="gym-artifacts-identity", daemon=True
        )
        self._thread.start()

    def _hash(
        self,
        run: RunArtifacts,
        known: Mapping[str, Known] | None,
        started: Mapping[str, tuple[list[int], JsonlInFlight]],
    ) -> None:
        try:
            identities = content_identities(run, known=known, started=started)
            self._result = identities, run_identity(identities)
        except BaseException as exc:  # handed to result(): raised in the caller's thread
            self._error = exc

    def result(self) -> tuple[dict[str, str], str]:
        """``(identities, run identity)``, once hashed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
