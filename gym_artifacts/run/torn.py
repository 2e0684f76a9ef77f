"""A JSONL file whose last line was torn: the writer was killed mid-write.

A last line without its newline that does not parse is partial; a last line without its
newline that parses is a complete record (many writers omit the final newline). Only the end of
the file is read to tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gym_artifacts.core.jsonio import MAX_LINE_BYTES, loads_lenient

_BLOCK = 1 << 16


@dataclass(frozen=True)
class PartialLine:
    """The torn end of a file: ``complete_bytes`` of whole lines, then ``partial_bytes``."""

    complete_bytes: int
    partial_bytes: int

    def describe(self, fpath: Path | str) -> str:
        return (
            f"{fpath}: the last line is partial ({self.partial_bytes} bytes): the writer was interrupted"
        )


def partial_last_line(fpath: Path | str) -> PartialLine | None:
    """The torn last line of ``fpath``, or None when its last line is whole (or it is empty)."""
    with open(fpath, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return None
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        # Walk back block by block to the last newline (bounded: a line is at most MAX_LINE_BYTES).
        pos = size
        start = 0
        while pos > 0 and size - pos <= MAX_LINE_BYTES:
            read_from = max(0, pos - _BLOCK)
            fh.seek(read_from)
            block = fh.read(pos - read_from)
            nl = block.rfind(b"\n")
            if nl >= 0:
                start = read_from + nl + 1
                break
            pos = read_from
        tail_len = size - start
        if tail_len > MAX_LINE_BYTES:
            return None  # too long to be a line at all: the readers refuse it with its line number
        fh.seek(start)
        tail = fh.read(tail_len)
    if not tail.strip():
        return None
    try:
        loads_lenient(tail)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return PartialLine(start, tail_len)
    return None
