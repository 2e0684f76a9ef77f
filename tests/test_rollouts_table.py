"""NeMo Gym's rollouts table as the export's one read writes it (``run/rollouts_table.py``): any
bytes, in any blocks of whole lines, give the table of the stripped non-blank lines that a line
at a time gives (the bulk path for plain lines, the line-at-a-time one for the rest)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gym_artifacts.run.rollouts_table import RolloutsTable

# the characters a table must escape or strip, and some it must carry as they are
TEXT = st.text(
    alphabet=st.sampled_from(["a", '"', "\\", "é", "\t", " ", "\r", "\x0b", "\x01", "😀", "\u2028", "{"])
)


def _reference(blocks: list[bytes]) -> dict:
    docs = [line.strip().decode() for block in blocks for line in block.split(b"\n") if line.strip()]
    return {"columns": ["Rollout"], "data": [[doc] for doc in docs]}


@given(st.lists(st.lists(TEXT, max_size=6), max_size=5))
def test_the_table_of_any_lines_in_any_blocks_is_the_line_at_a_time_table(
    blocks_of_lines: list[list[str]],
) -> None:
    blocks = [("\n".join(lines) + "\n").encode() if lines else b"" for lines in blocks_of_lines]
    table = RolloutsTable()
    try:
        for block in blocks:
            table.feed(block)
        assert table.finish()
        expected = _reference(blocks)
        assert json.loads(table.path.read_bytes()) == expected
        assert table.rows == len(expected["data"])
    finally:
        table.close()
    assert not table.path.exists()


def test_a_line_that_is_not_utf8_abandons_the_table() -> None:
    table = RolloutsTable()
    table.feed(b'{"a": 1}\n')
    table.feed(b'{"a": "\xff"}\n')
    assert not table.finish()
    table.close()
    assert not table.path.exists()
