"""The backend contract a plugin author can hold in mind, attacked where it promises.

- The minimal backend of docs/plugins.md (its code block, read from the page: the docs cannot
  drift) implements at most five methods, and the contract suite passes over it, installed as a
  user installs a plugin (an entry point in a distribution on the path), post-run and live.
- A plugin that overrides nothing, one that leaves out any one required hook, and one whose hook
  the core could not call as the contract does (a parameter missing, an extra one required) are
  refused at load, the message naming each hook (and both signatures): before any run is opened.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from gym_artifacts import plugin as ga
from gym_artifacts.contract import registry
from gym_artifacts.contract.hooks import hooks_with_wrong_signatures, missing_hooks
from gym_artifacts.core.errors import ConfigError
from tests.processes import run_bounded

REPO = Path(__file__).resolve().parent.parent
PLUGINS_PAGE = REPO / "docs" / "plugins.md"
MARKER = "<!-- minimal-plugin:"
MAX_METHODS = 5
REQUIRED_LIVE = ["_export", "_log_metrics", "_setup", "_teardown"]


def minimal_plugin_source(page: Path = PLUGINS_PAGE) -> str:
    """The Python code block that follows the ``minimal-plugin`` marker on the plugins page."""
    text = page.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"{page} must mark exactly one minimal plugin block"
    found = re.search(r"```python\n(.*?)\n```", text[text.index(MARKER) :], re.S)
    assert found is not None, "no ```python block after the minimal-plugin marker"
    return found.group(1) + "\n"


def _backend_classes(source: str) -> dict[str, ast.ClassDef]:
    """The classes of ``source`` that set a backend ``name``, by that name."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == ["name"]
                        and isinstance(statement.value, ast.Constant)):  # fmt: skip
                    out[statement.value.value] = node
    return out


def test_the_minimal_plugin_implements_at_most_five_methods() -> None:
    classes = list(_backend_classes(minimal_plugin_source()).values())
    assert classes, "the minimal plugin defines no backend class"
    methods = [f.name for c in classes for f in c.body if isinstance(f, ast.FunctionDef)]
    assert len(methods) <= MAX_METHODS, methods
    assert set(REQUIRED_LIVE) <= set(methods)  # what it implements is the required hooks


def _install(site: Path, module: str, source: str, entry_points: dict[str, str]) -> None:
    """``source`` as module ``module`` in a distribution installed into ``site`` (its
    entry points in the ``gym_artifacts.exporters`` group): what ``pip install`` leaves."""
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    lines = [f"{name} = {module}:{target}" for name, target in entry_points.items()]
    (info / "entry_points.txt").write_text("[gym_artifacts.exporters]\n" + "\n".join(lines) + "\n")


@pytest.mark.slow
def test_the_contract_suite_passes_over_the_minimal_plugin(tmp_path: Path) -> None:
    source = minimal_plugin_source()
    module = "docs_minimal_plugin"
    site = tmp_path / "site"
    site.mkdir()
    classes = {name: node.name for name, node in _backend_classes(source).items()}
    _install(site, module, source, classes)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop("GYM_ARTIFACTS_CONTRACT", None)
    command = [sys.executable, "-m", "gym_artifacts.testing", *classes, "--", "-p", "no:randomly",
               "-W", "ignore::DeprecationWarning", "-rs"]  # fmt: skip
    proc = run_bounded(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    live = [name for name, node in _backend_classes(source).items() if "LiveExporter" in ast.unparse(node)]
    post_run_only = len(classes) - len(live)
    tests_per_backend = 7
    skipped = 2 * post_run_only  # a post-run-only backend skips the live and the resume test
    assert f"{tests_per_backend * len(classes) - skipped} passed" in out, out[-4000:]
    assert (f"{skipped} skipped" in out) if skipped else ("skipped" not in out), out[-4000:]
    assert live, "the minimal plugin must show a live backend"


# -- plugins that break the contract are refused at load, each problem named ----------------------
class Settings(ga.ExporterConfig):
    pass


def _live(name: str, **hooks: Any) -> type:
    return type(name, (ga.LiveExporter,), {"name": name.lower(), "config_model": Settings, **hooks})


GOOD = {
    "_export": lambda self, run, plan: ga.Sent("r"),
    "_setup": lambda self: "r",
    "_log_metrics": lambda self, metrics, step, timestamp: None,
    "_teardown": lambda self, status: None,
}


def test_a_plugin_overriding_nothing_is_refused_naming_every_required_hook() -> None:
    empty = _live("Nothing")
    assert missing_hooks(empty) == REQUIRED_LIVE
    with pytest.raises(ConfigError, match=r"does not implement the required hook\(s\) " + ", ".join(REQUIRED_LIVE)):
        registry.register(empty)
    assert "nothing" not in registry.discover()


def test_the_required_hooks_alone_make_a_backend() -> None:
    minimal = _live("Minimal", **GOOD)
    assert missing_hooks(minimal) == [] and hooks_with_wrong_signatures(minimal) == []
    registry.check_backend_class(minimal, "minimal", "tests:Minimal")  # what loading checks: passes


@pytest.mark.parametrize("left_out", REQUIRED_LIVE)
def test_each_required_hook_left_out_is_named(left_out: str) -> None:
    partial = _live("Partial", **{k: v for k, v in GOOD.items() if k != left_out})
    with pytest.raises(ConfigError, match=rf"required hook\(s\) {left_out} "):
        registry.register(partial)


WRONG = [
    ("_log_metrics", lambda self, metrics: None, "(self, metrics, step, timestamp)"),
    ("_teardown", lambda self: None, "(self, status)"),
    ("_export", lambda self, run: ga.Sent("r"), "(self, run, plan)"),
    ("_setup", lambda self, run_id: "r", "(self)"),  # a parameter the core never passes
    ("_log_rollouts", lambda self: None, "(self, rollouts)"),  # an optional hook, overridden wrongly
    ("_certify", lambda self, run, plan, live_run_id, *, force: ga.Sent("r"), "(self, run, plan, live_run_id)"),
    ("contract_settings", classmethod(lambda cls: {}), "(folder)"),
]


@pytest.mark.parametrize(("hook", "wrong", "needed"), WRONG, ids=[w[0] for w in WRONG])
def test_a_hook_the_core_cannot_call_is_refused_with_both_signatures(hook: str, wrong: Any, needed: str) -> None:
    broken = _live("Broken", **{**GOOD, hook: wrong})
    [problem] = hooks_with_wrong_signatures(broken)
    assert problem.startswith(f"{hook}(") and f"cannot be called as {hook}" in problem
    with pytest.raises(ConfigError, match=re.escape(needed)):
        registry.register(broken)
    assert "broken" not in registry.discover()


def test_hooks_that_take_more_than_the_core_passes_are_kept() -> None:
    """Extra parameters with defaults, ``*args`` and ``**kwargs`` can be called as the contract
    does: not refused."""
    lenient = _live("Lenient", **{**GOOD, "_log_metrics": lambda self, *args, extra=1: None,
                                  "_teardown": lambda self, status, reason=None: None})  # fmt: skip
    assert hooks_with_wrong_signatures(lenient) == []


def test_a_plugin_written_for_the_old_post_run_hook_name_keeps_working() -> None:
    """A live backend from before the contract was narrowed named its post-run hook
    ``_export_post_run``: it loads, with a DeprecationWarning, and that method is its ``_export``."""
    with pytest.warns(DeprecationWarning, match=r"_export_post_run: name the post-run hook _export"):
        old = _live("Old", **{k: v for k, v in GOOD.items() if k != "_export"},
                    _export_post_run=lambda self, run, plan: ga.Sent("old"))  # fmt: skip
    assert missing_hooks(old) == [] and hooks_with_wrong_signatures(old) == []
    assert old(Settings())._export(None, None).backend_run_id == "old"
