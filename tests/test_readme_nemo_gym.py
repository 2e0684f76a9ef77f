"""The NeMo Gym import swap, as README and docs/coming-from-nemo-gym.md show it, names what the code has.

The docs page shows both call-site forms (the module functions and the context manager); README
shows the one-line import swap, which must name the same five functions.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


API = {"setup_exporters", "get_exporters", "export_metrics", "export_rollouts", "teardown_exporters"}


def section_code(page: str = "docs/coming-from-nemo-gym.md", heading: str = "## What to change") -> list[str]:
    """The Python blocks of one section of a Markdown page."""
    text = (REPO / page).read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def imports(blocks: list[str]) -> dict[str, set[str]]:
    """The names each ``from MODULE import ...`` of the blocks imports, by module."""
    found: dict[str, set[str]] = {}
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.setdefault(node.module, set()).update(a.name for a in node.names)
    return found


def test_coming_from_nemo_gym_shows_both_call_site_forms_with_real_names() -> None:
    blocks = section_code()
    imported = imports(blocks)
    called = {
        node.func.id
        for block in blocks
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert imported.get("gym_artifacts.nemo_gym") == API  # the one-import-line switch
    assert "live_run" in imported.get("gym_artifacts.live", set())  # the context-manager form
    assert API - {"get_exporters"} <= called
    for module, names in imported.items():
        if module.startswith("gym_artifacts"):
            loaded = importlib.import_module(module)
            assert all(callable(getattr(loaded, n, None)) for n in names), (module, names)


def test_readme_shows_the_same_import_swap() -> None:
    assert imports(section_code("README.md", "## Coming from NeMo Gym")) == {"gym_artifacts.nemo_gym": API}
