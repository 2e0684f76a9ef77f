"""Every module's text compiles on every Python the project runs under (3.11 here, NeMo Gym's 3.13).

Python 3.13 strips a docstring's indentation when it compiles, and refuses a docstring holding a
lone surrogate (``"\\udce9"`` written with one backslash), where 3.11 accepts it: the package then
fails to import in NeMo Gym's own environment, and so does every ``gym-artifacts instrument`` run.
(Other string constants with a surrogate compile on both.) Checked over the syntax tree, so it
holds whichever Python runs the suite.
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


def _unencodable_docstrings(path: Path) -> list[int]:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    lines = []
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if not isinstance(node, owners) or not node.body:
            continue
        first = node.body[0]
        docstring = (
            first.value.value
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            else None
        )
        if isinstance(docstring, str):
            try:
                docstring.encode("utf-8")
            except UnicodeEncodeError:
                lines.append(first.lineno)
    return lines


def test_no_docstring_holds_a_lone_surrogate() -> None:
    found = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := _unencodable_docstrings(p))}
    assert not found, f"docstrings Python 3.13 cannot compile (write the escape as \\\\udc..): {found}"


@pytest.mark.parametrize(
    "text", ['"\\udce9"', '"""a ``\\udce9`` b"""', 'def f():\n    """\\udce9"""', 'class C:\n    "\\udce9"']
)
def test_the_check_finds_a_lone_surrogate(tmp_path: Path, text: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(text + "\n")
    assert _unencodable_docstrings(module) == [text.count("\n") + 1]


def test_a_surrogate_outside_a_docstring_is_not_flagged(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""doc"""\nNAME = "\\udce9"\n')
    assert _unencodable_docstrings(module) == []
