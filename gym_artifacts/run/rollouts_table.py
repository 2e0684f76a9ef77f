"""NeMo Gym's rollouts table, written a row at a time.

NeMo Gym logs each rollout as one JSON document in a one-column table (column ``Rollout``, pandas'
``split`` layout: what ``mlflow.log_table`` writes and ``mlflow.load_table`` reads). ``SplitTable``
writes that layout from documents a backend gives; ``RolloutsTable`` is the same table written by
the export's one read of the rollouts (``jsonl_pass``), each complete line a document as written,
so that a backend ships it without reading the rollouts again (issue 43). Memory stays flat in
the number of rows: both write to a file.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO

ROLLOUT_COLUMN = "Rollout"
TABLE_FILE = "rollouts.json"  # the table artifact's name (NeMo Gym's MLflow exporter)


class SplitTable:
    """A one-column table (``ROLLOUT_COLUMN``) in pandas' split layout, written to ``fh`` a row
    at a time; ``end()`` closes the layout. ValueError for a document UTF-8 cannot carry."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.rows = 0
        fh.write(json.dumps({"columns": [ROLLOUT_COLUMN]})[:-1].encode() + b',"data":[')

    def add(self, document: str) -> None:
        row = json.dumps([document], ensure_ascii=False).encode("utf-8")
        self._fh.write(b"," + row if self.rows else row)
        self.rows += 1

    def add_plain_lines(self, body: bytes) -> None:
        """Each line of ``body`` (lines joined by newlines, UTF-8, none blank or with white space
        at its ends, no control character: ``_plain``) as a row, escaped for a JSON
        string in bulk (``\\`` and ``"``: the only characters such a line holds that JSON escapes)
        instead of one ``json.dumps`` a line: 100,000 rows in a fraction of the time."""
        if not body:
            return
        escaped = body.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
        rows = b'["' + escaped.replace(b"\n", b'"],["') + b'"]'
        self._fh.write(b"," + rows if self.rows else rows)
        self.rows += body.count(b"\n") + 1

    def end(self) -> None:
        self._fh.write(b"]}")


# What ``SplitTable.add_plain_lines`` cannot take as it is: a control character other than the
# line ends (JSON escapes them), a blank line, or white space at a line's start or end (a row is
# the stripped line; a control character covers all white space but spaces and newlines). Each
# is its own C-speed scan: one pattern of alternatives costs 100x more than these together.
_CONTROLS = bytes(range(0x20)).replace(b"\n", b"")
_SPACE_AFTER_NEWLINE = re.compile(rb"\n[ \n]")
_SPACE_BEFORE_NEWLINE = re.compile(rb" \n")


def _plain(body: bytes) -> bool:
    """``body`` can be written by ``SplitTable.add_plain_lines`` (the comment above)."""
    if body[:1] in (b" ", b"\n") or body[-1:] in (b" ", b"\n"):
        return False
    if len(body.translate(None, _CONTROLS)) != len(body):
        return False
    return _SPACE_AFTER_NEWLINE.search(body) is None and _SPACE_BEFORE_NEWLINE.search(body) is None


class RolloutsTable:
    """The table of the rollouts' complete lines, fed a block of whole lines at a time (blank
    lines skipped, each line a document as written), in a file of its own (``path``, named
    ``TABLE_FILE``) once ``finish()`` returned True. A line that is not UTF-8 abandons the table
    (``finish()`` False): the backend makes it from the file, as without the one read."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gym-artifacts-table-"))
        self.path = self._dir / TABLE_FILE
        self._fh: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115 (closed by finish/close)
        self._table = SplitTable(self._fh)
        self._ok = True

    @property
    def rows(self) -> int:
        return self._table.rows

    def feed(self, block: bytes) -> None:
        if not self._ok:
            return
        try:
            body = block[:-1] if block.endswith(b"\n") else block
            if _plain(body):
                body.decode("utf-8")  # the check only: the lines are written as their bytes
                self._table.add_plain_lines(body)
                return
            for line in block.split(b"\n"):
                document = line.strip()
                if document:
                    self._table.add(document.decode("utf-8"))
        except ValueError:  # not UTF-8: the table made from the file says so (or is not made)
            self._ok = False

    def finish(self) -> bool:
        """The table complete in ``path``; False when it was abandoned."""
        if self._fh is not None:
            self._table.end()
            self._fh.close()
            self._fh = None
        return self._ok

    def close(self) -> None:
        """Let the table's file go."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        shutil.rmtree(self._dir, ignore_errors=True)
