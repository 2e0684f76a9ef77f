"""The digests every identity is made of: blake3 in the ``b3:`` form, a JSONL file's
order-independent multiset of records, and a stream's non-blank line count.

Apart from ``identity`` so that the one read of a JSONL file (``jsonl_pass``) and the identity
build the same digests without importing each other.
"""

from __future__ import annotations

import re

import blake3

PREFIX = "b3:"
_MOD = 1 << 256
# blake3's binding lets the GIL go while it hashes an input of 2 KiB or more (blake3-py 1.0): a
# thread that must not wait for the GIL feeds it pieces below that (``keep_gil``).
GIL_KEPT_PIECE = 1024


def hex_digest(hasher: blake3.blake3) -> str:
    """A finished hasher's digest in the ``b3:`` form every identity takes."""
    return PREFIX + hasher.hexdigest()


# Two newlines with only white space between them: a blank line (``bytes.strip``'s white space).
_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")


class LineCounter:
    """Non-blank lines of a stream fed in chunks, by ``jsonio.count_lines``'s rule (a line of
    white space only does not count; an unterminated last line with text does), in constant
    memory however long a line is. A chunk without a blank line, the usual case, is counted by
    its newlines and one regular-expression scan (C speed: about as fast as ``count_lines``, but
    from a read the export makes anyway)."""

    __slots__ = ("_lines", "_tail_has_text")

    def __init__(self) -> None:
        self._lines = 0
        self._tail_has_text = False

    def feed(self, chunk: bytes | bytearray) -> None:
        first = chunk.find(b"\n")
        if first < 0:
            self._tail_has_text = self._tail_has_text or bool(chunk.strip())
            return
        last = chunk.rfind(b"\n")
        if self._tail_has_text or chunk[:first].strip():
            self._lines += 1  # the line that ends at the chunk's first newline
        if last > first:  # the lines between the first newline and the last
            middle = chunk.count(b"\n", first + 1, last + 1)
            if _BLANK_LINE.search(chunk, first, last + 1) is not None:
                pieces = chunk[first + 1 : last].split(b"\n")
                middle = sum(1 for piece in pieces if piece.strip())
            self._lines += middle
        self._tail_has_text = bool(chunk[last + 1 :].strip())

    @property
    def count(self) -> int:
        return self._lines + (1 if self._tail_has_text else 0)


class JsonlDigest:
    """A multiset digest of JSONL records: the sum modulo 2**256 of the records' digests.

    Addition commutes, so line order does not count, and partial sums over chunks of a file can
    be computed apart (in parallel) and merged.
    """

    __slots__ = ("count", "total")

    def __init__(self, count: int = 0, total: int = 0) -> None:
        self.count = count
        self.total = total

    def add_record_bytes(self, canonical: bytes, *, keep_gil: bool = False) -> None:
        """Add one record's canonical bytes. ``keep_gil``: hash them without letting the GIL go
        (the same digest): the eval's thread in a live run, where another thread busy in Python
        would keep the GIL for a whole switch interval once it had it."""
        if keep_gil and len(canonical) >= GIL_KEPT_PIECE:
            hasher, view = blake3.blake3(), memoryview(canonical)
            for start in range(0, len(view), GIL_KEPT_PIECE):
                hasher.update(view[start : start + GIL_KEPT_PIECE])
            digest = hasher.digest()
        else:
            digest = blake3.blake3(canonical).digest()
        self.total = (self.total + int.from_bytes(digest, "big")) % _MOD
        self.count += 1

    def merge(self, other: JsonlDigest) -> None:
        self.count += other.count
        self.total = (self.total + other.total) % _MOD

    def hexdigest(self) -> str:
        final = blake3.blake3(b"jsonl-multiset-v1\0")
        final.update(self.count.to_bytes(8, "big"))
        final.update(self.total.to_bytes(32, "big"))
        return hex_digest(final)
