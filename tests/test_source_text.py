"""Every module's text compiles on every Python the project runs under (3.11 here, NeMo Gym's 3.13).

Python 3.13 refuses to compile a string constant holding a lone surrogate (``"\\udce9"`` written
with one backslash in a docstring), where 3.11 accepts it: the package then fails to import in
NeMo Gym's own environment, and so does every ``gym-artifacts instrument`` run. Checked over the
syntax tree, so it holds whichever Python runs the suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    path
    for folder in ("gym_artifacts", "exporters", "examples", "benchmarks", "scripts", "tests")
    for path in (ROOT / folder).rglob("*.py")
    if ".venv" not in path.parts
)


def _unencodable_constants(path: Path) -> list[int]:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node.value.encode("utf-8")
            except UnicodeEncodeError:
                lines.append(node.lineno)
    return lines


def test_no_string_constant_holds_a_lone_surrogate() -> None:
    found = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := _unencodable_constants(p))}
    assert not found, f"string constants Python 3.13 cannot compile (write the escape as \\\\udc..): {found}"


@pytest.mark.parametrize("text", ['"\\udce9"', '"""a ``\\udce9`` b"""'])
def test_the_check_finds_a_lone_surrogate(tmp_path: Path, text: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(text + "\n")
    assert _unencodable_constants(module) == [1]
