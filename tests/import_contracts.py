"""An import-linter contract type that sees every spelling of an import of the built-in backends.

grimp loses ``from gym_artifacts._builtin_exporters._mlflow_client import X``: in a checkout that
package holds no module of its own (its modules are the ``exporters/`` folder, added to its path at
run time), so grimp does not know the module imported and drops the import. (``from
gym_artifacts._builtin_exporters import _mlflow_client`` and ``import ...`` it keeps, as an import of
the package.) ``forbidden_any_spelling`` reads each module's import statements itself, adds to the
graph every import of a module under a forbidden package that grimp left out, then checks exactly
as import-linter's ``forbidden`` contract does. Registered in ``pyproject.toml``
(``[tool.importlinter] contract_types``); ``lint-imports`` finds it because it puts the working
folder (the repository) first on the path.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from grimp import ImportGraph
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain.contract import ContractCheck


def module_file(module: str, roots: dict[str, Path | None]) -> Path | None:
    """The source file of ``module`` (found from its root package's folder, importing nothing)."""
    root, *rest = module.split(".")
    if root not in roots:
        spec = importlib.util.find_spec(root)
        origin = spec.origin if spec is not None else None
        roots[root] = Path(origin).parent if origin and origin.endswith("__init__.py") else None
    folder = roots[root]
    if folder is None:
        return None
    for candidate in (folder.joinpath(*rest, "__init__.py"), folder.joinpath(*rest).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imports_of(source: str) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for each absolute import statement of ``source``, anywhere in it."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


class ForbiddenAnySpelling(ForbiddenContract):
    """import-linter's ``forbidden`` contract, with the imports grimp dropped put back first."""

    type_name = "forbidden_any_spelling"

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        forbidden = tuple(e.expression for e in self.forbidden_modules)  # type: ignore[attr-defined]
        roots: dict[str, Path | None] = {}
        for module in sorted(graph.modules):
            fpath = module_file(module, roots)
            if fpath is None:
                continue
            lines = fpath.read_text(encoding="utf-8").splitlines()
            for line, imported in imports_of("\n".join(lines)):
                if imported.startswith(tuple(f"{name}." for name in forbidden)):
                    graph.add_import(
                        importer=module, imported=imported, line_number=line, line_contents=lines[line - 1].strip()
                    )
        return super().check(graph, verbose)
