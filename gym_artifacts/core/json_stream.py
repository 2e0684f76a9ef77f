"""One large JSON document read as a stream of events, so that what a reader keeps, not the
document's size, decides its memory.

NeMo Gym 0.7 writes every task's ``rollout_infos`` into one JSON document (the aggregate metrics
file: about 50 MB for 100,000 rollouts), which a whole-document parse holds at about three times
its size. ``json_events`` streams it with ijson's C parser; ``build_value`` turns one value of
the stream (an agent's head, one task's entry) into Python objects, and
``canonical_digest`` computes the digest of the document's canonical form
(``jsonio.canonical_json``) without holding it, spilling a large object member to disk until
the object's keys can be sorted.

The stream accepts strict JSON only. Whatever ``jsonio.read_json`` accepts beyond it (NaN and
infinities, integers past 64 bits, lone surrogate escapes) and every malformed document raise
``NotStreamable``: the caller then reads the document whole, which gives those values their
usual meaning and a malformed file its usual error naming the line and column.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from gym_artifacts.core.jsonio import MAX_JSON_DEPTH, open_regular

STREAMED_JSON_MIN_BYTES = 8 << 20
"""JSON files at least this large are read as a stream (smaller ones whole: faster, same result)."""

SPILL_BYTES = 4 << 20
"""An object member whose canonical bytes pass this size waits on disk for its object's end."""

_CHUNK = 1 << 20
_REFUSED = re.compile(rb"\\u[dD][89a-fA-F]|[\x0b\x0c]")
_CONTAINER_START = {"start_map", "start_array"}
_CONTAINER_END = {"end_map", "end_array"}

Event = tuple[str, Any]


class NotStreamable(Exception):
    """The document is not strict JSON the stream can read exactly: read it whole instead."""


class _Guarded(io.RawIOBase):
    """The file's bytes as strict JSON for yajl (ijson's C parser), refusing (``NotStreamable``)
    what yajl reads differently from ``jsonio.loads_lenient``:

    - a surrogate escape anywhere: ijson decodes a lone one differently, and telling a lone one
      from half of a pair (an escaped emoji) across read boundaries is not worth it in a file of
      numbers;
    - a form feed or a vertical tab: yajl takes them for white space, which JSON does not (and
      they are never valid inside a string either).

    At the end of the file one line break follows: yajl takes the end of its input for "more to
    come" in an unterminated string after the document, and reads past it; a raw line break ends
    such a string with an error, and is white space after a valid document.
    """

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self._tail = b""
        self._ended = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson's probe for bytes or text: not the end of the file
            return b""
        chunk = self._fh.read(_CHUNK if size is None or size < 0 else size)
        if not chunk:
            if self._ended:
                return b""
            self._ended = True
            return b"\n"
        if _REFUSED.search(self._tail + chunk):
            raise NotStreamable("a surrogate escape, a form feed or a vertical tab")
        self._tail = chunk[-5:]
        return chunk

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def json_events(fpath: Path, what: str = "JSON") -> Iterator[Event]:
    """``(event, value)`` pairs of the document in ``fpath`` (ijson's events without prefixes);
    ``NotStreamable`` when it is not strict JSON, nests deeper than ``MAX_JSON_DEPTH`` or ijson
    is not installed."""
    try:
        import ijson
    except ImportError as exc:  # pragma: no cover - a base dependency
        raise NotStreamable("ijson is not installed") from exc
    with open_regular(fpath, what) as fh:
        depth = 0
        try:
            for _, event, value in ijson.parse(_Guarded(fh), use_float=True, buf_size=_CHUNK):
                if event in _CONTAINER_START:
                    depth += 1
                    if depth > MAX_JSON_DEPTH:
                        raise NotStreamable("nested too deep")
                elif event in _CONTAINER_END:
                    depth -= 1
                yield event, value
        except ijson.JSONError as exc:
            raise NotStreamable(str(exc)) from None
        except UnicodeDecodeError as exc:  # bytes yajl passes on that are not UTF-8: the whole
            raise NotStreamable(str(exc)) from None  # read names their line and column


def build_value(events: Iterator[Event], first: Event) -> Any:
    """The whole value that starts with event ``first`` (the rest taken from ``events``)."""
    event, value = first
    if event not in _CONTAINER_START:
        return value
    from ijson.common import ObjectBuilder

    builder = ObjectBuilder()
    builder.event(event, value)
    depth = 1
    for event, value in events:
        builder.event(event, value)
        if event in _CONTAINER_START:
            depth += 1
        elif event in _CONTAINER_END:
            depth -= 1
            if depth == 0:
                return builder.value
    raise NotStreamable("the document ended inside a value")


class _Sink:
    """Bytes written in order: in memory, then in an anonymous temporary file past ``SPILL_BYTES``."""

    __slots__ = ("_buffer", "_size")

    def __init__(self) -> None:
        self._buffer: IO[bytes] = io.BytesIO()
        self._size = 0

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > SPILL_BYTES and isinstance(self._buffer, io.BytesIO):
            spilled = tempfile.TemporaryFile()  # noqa: SIM115 - closed by drain()
            spilled.write(self._buffer.getvalue())
            self._buffer = spilled
        self._buffer.write(data)

    def drain(self, write: Callable[[bytes], object]) -> None:
        if isinstance(self._buffer, io.BytesIO):
            write(self._buffer.getvalue())
            return
        self._buffer.seek(0)
        while chunk := self._buffer.read(_CHUNK):
            write(chunk)
        self._buffer.close()


class _Object:
    """An object being read: its members' canonical bytes by key (a repeated key: the last wins,
    as every whole-document parser here keeps it)."""

    __slots__ = ("key", "members")

    def __init__(self) -> None:
        self.members: dict[str, _Sink] = {}
        self.key = ""

    def written_to(self, key: str) -> _Sink:
        self.key = key
        sink = self.members[key] = _Sink()
        return sink

    def emit(self, write: Callable[[bytes], object]) -> None:
        write(b"{")
        for i, key in enumerate(sorted(self.members)):
            write((b",%s:" if i else b"%s:") % orjson.dumps(key))
            self.members[key].drain(write)
        write(b"}")


def _scalar(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError) as exc:  # a value only the stdlib writes
        raise NotStreamable(str(exc)) from None


class _List:
    """A list being read: its items go straight to where the list goes, commas between them."""

    __slots__ = ("first", "out")

    def __init__(self, out: Callable[[bytes], object]) -> None:
        self.out = out
        self.first = True

    def next_item(self) -> Callable[[bytes], object]:
        if not self.first:
            self.out(b",")
        self.first = False
        return self.out


def canonical_digest(fpath: Path, update: Callable[[bytes], object], what: str = "JSON") -> None:
    """Feed ``update`` the canonical bytes of the document in ``fpath``, exactly
    ``canonical_json(read_json(fpath))``, holding no more than one spilled member's buffer and
    the keys of the objects open at any moment. ``NotStreamable``: read it whole instead
    (what was fed is of no use: start the digest anew)."""
    stack: list[_List | tuple[_Object, Callable[[bytes], object]]] = []
    member: Callable[[bytes], object] = update  # where an object's next member value goes
    for event, value in json_events(fpath, what):
        if event == "map_key":
            top = stack[-1]
            assert isinstance(top, tuple)
            member = top[0].written_to(value).write
            continue
        if event == "end_array":
            frame = stack.pop()
            assert isinstance(frame, _List)
            frame.out(b"]")
            continue
        if event == "end_map":
            frame_map = stack.pop()
            assert isinstance(frame_map, tuple)
            frame_map[0].emit(frame_map[1])
            continue
        top_frame = stack[-1] if stack else None
        target = top_frame.next_item() if isinstance(top_frame, _List) else member
        if event == "start_array":
            target(b"[")
            stack.append(_List(target))
        elif event == "start_map":
            stack.append((_Object(), target))
        else:
            target(_scalar(value))
    if stack:
        raise NotStreamable("the document ended inside a value")


def canonical_bytes(fpath: Path) -> bytes:
    """``canonical_digest``'s bytes, gathered (for tests: the stream against ``canonical_json``)."""
    out = io.BytesIO()
    canonical_digest(fpath, out.write)
    return out.getvalue()


__all__ = [
    "STREAMED_JSON_MIN_BYTES",
    "NotStreamable",
    "build_value",
    "canonical_bytes",
    "canonical_digest",
    "json_events",
]
