"""README's "Coming from NeMo Gym" shows both call-site forms with names the code really has."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def section_code() -> list[str]:
    """The Python blocks of README's "Coming from NeMo Gym" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Coming from NeMo Gym", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_coming_from_nemo_gym_shows_both_call_site_forms_with_real_names() -> None:
    imported: dict[str, set[str]] = {}
    called: set[str] = set()
    for block in section_code():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
    api = {"setup_exporters", "get_exporters", "export_metrics", "export_rollouts", "teardown_exporters"}
    assert imported.get("gym_artifacts.nemo_gym") == api  # the one-import-line switch
    assert "live_exporters" in imported.get("gym_artifacts.live", set())  # the context-manager form
    assert api - {"get_exporters"} <= called
    for module, names in imported.items():
        if module.startswith("gym_artifacts"):
            loaded = importlib.import_module(module)
            assert all(callable(getattr(loaded, n, None)) for n in names), (module, names)
