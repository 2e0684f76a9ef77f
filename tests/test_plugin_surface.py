"""The plugin API is what backends use, and backends use nothing else of the project.

``gym_artifacts.plugin.__all__`` lists only names a built-in backend (``exporters/``) or an
example plugin (``examples/ledger_plugin``, and the minimal backend of docs/plugins.md, which the
contract suite runs over) imports: a name nobody imports is surface a plugin author reads for
nothing. Read from the sources with ``ast``, so the check cannot drift.

The built-in backends import nothing of the project but ``gym_artifacts.plugin`` (import-linter's
``backends-plugin-only`` contract says so too; this is its backstop, since grimp does not see
imports spelled ``gym_artifacts._builtin_exporters.<module>``), and no product module outside
``exporters/`` imports a backend's private module (``_name``), whichever name it is imported by.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib

import gym_artifacts.plugin as plugin
from tests.test_plugin_minimal import minimal_plugin_source

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ROOT / "exporters"
EXAMPLE = ROOT / "examples" / "ledger_plugin"
PRODUCT = (ROOT / "gym_artifacts", ROOT / "benchmarks")
BACKEND_PACKAGES = ("exporters", "gym_artifacts._builtin_exporters")


def _plugin_trees() -> Iterator[ast.Module]:
    """The built-in backends, the example plugin and the docs' minimal plugin."""
    yield from (tree for _, tree in _trees(BACKENDS, EXAMPLE))
    yield ast.parse(minimal_plugin_source())


def _trees(*folders: Path) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for fpath in sorted(folder.rglob("*.py")):
            yield fpath, ast.parse(fpath.read_text(encoding="utf-8"), str(fpath))


def plugin_names_used(tree: ast.Module) -> set[str]:
    """Names of ``gym_artifacts.plugin`` a module uses: ``from gym_artifacts.plugin import X``,
    and ``P.X`` where ``P`` is the module imported whole (``from gym_artifacts import plugin as P``,
    ``import gym_artifacts.plugin as P``)."""
    used: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "gym_artifacts.plugin":
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "gym_artifacts":
            aliases |= {a.asname or a.name for a in node.names if a.name == "plugin"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "gym_artifacts.plugin" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            used.add(node.attr)
    return used


def imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every module a file imports, by line (``from P import m`` yields ``P.m`` too: ``m`` may be a
    module), in code and in the code strings a benchmark runs in a fresh process."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            for text in node.value.splitlines():  # line by line: a template need not parse whole
                try:
                    inner = ast.parse(text.strip())
                except SyntaxError:
                    continue
                yield from ((node.lineno, m) for _, m in imported_modules(inner))


def _private_backend_module(module: str) -> bool:
    for package in BACKEND_PACKAGES:
        if module.startswith(package + "."):
            return module[len(package) + 1 :].split(".")[0].startswith("_")
    return False


def test_every_plugin_name_is_used_by_a_backend_or_the_example() -> None:
    used = set().union(*(plugin_names_used(tree) for tree in _plugin_trees()))
    assert sorted(set(plugin.__all__) - used) == [], "names in plugin.__all__ that no backend imports"


def test_every_name_a_backend_uses_is_offered() -> None:
    used = set().union(*(plugin_names_used(tree) for tree in _plugin_trees()))
    assert sorted(used - set(plugin.__all__)) == []
    assert all(hasattr(plugin, name) for name in plugin.__all__)


def test_backends_import_only_the_plugin_api() -> None:
    """The import contract's backstop: a backend imports ``gym_artifacts.plugin`` and nothing
    else of the project, however spelled."""
    found = [
        f"{fpath.relative_to(ROOT)}:{line}: {module}"
        for fpath, tree in _trees(BACKENDS)
        for line, module in imported_modules(tree)
        if module.split(".")[0] == "gym_artifacts"
        and not module.startswith(("gym_artifacts.plugin", "gym_artifacts._builtin_exporters"))
        and module != "gym_artifacts"
    ]
    assert found == []


def test_no_product_module_imports_a_backends_private_module() -> None:
    found = [
        f"{fpath.relative_to(ROOT)}:{line}: {module}"
        for fpath, tree in _trees(*PRODUCT)
        for line, module in imported_modules(tree)
        if _private_backend_module(module)
    ]
    assert found == []


def test_the_import_contract_covers_every_part_of_the_package() -> None:
    """``backends-by-entry-point-only`` names each part of gym_artifacts (a source holding the
    forbidden package would check nothing): a new subpackage joins it or this fails."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["id"] == "backends-by-entry-point-only"]
    package = ROOT / "gym_artifacts"
    parts = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    expected = {f"gym_artifacts.{part}" for part in parts - {"__init__", "_builtin_exporters"}} | {"benchmarks"}
    assert set(contract["source_modules"]) == expected
    assert set(contract["forbidden_modules"]) == set(BACKEND_PACKAGES)


def test_the_checks_see_what_they_look_for() -> None:
    """The readers above find each spelling they are meant to find (or they pass for nothing)."""
    tree = ast.parse(
        "from gym_artifacts import plugin as ga\nimport gym_artifacts.plugin as gp\n"
        "from gym_artifacts.plugin import Sent\nga.RunPayload; gp.ExportPlan\n"
        "CODE = '''from gym_artifacts._builtin_exporters import _otlp as o\n'''\n"
        "import exporters._mlflow_client\n"
    )
    assert plugin_names_used(tree) == {"Sent", "RunPayload", "ExportPlan"}
    modules = [m for _, m in imported_modules(tree)]
    assert {m for m in modules if _private_backend_module(m)} == {
        "gym_artifacts._builtin_exporters._otlp",
        "exporters._mlflow_client",
    }


def test_every_promised_name_imports() -> None:
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
    assert {"Exporter", "LiveExporter", "ExporterConfig", "CannotCertify", "RunStatus"} <= set(plugin.__all__)
