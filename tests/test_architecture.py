"""The layering of ``docs/architecture.md`` is checked by a tool: ``lint-imports`` (import-linter)
runs the contracts in ``pyproject.toml`` (``[tool.importlinter]``) over this checkout and keeps
every one, and the check bites: a copy of the package with one forbidden import planted per
contract breaks each contract, named in the report.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_bounded

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]

if not LINT_IMPORTS.is_file():  # pragma: no cover - the test extra installs it
    pytest.skip("import-linter is not installed (pip install 'gym-artifacts[test]')", allow_module_level=True)

# One forbidden import per contract: (contract id, file, line appended to it).
PLANTED = [
    # A cycle: config imports jsonio; jsonio importing config closes it (one package, so only the
    # acyclic contract sees it).
    ("acyclic", "gym_artifacts/core/jsonio.py", "from gym_artifacts.core import config as _planted_cycle"),
    # A lower layer importing a higher one: the run model importing the export engine.
    ("layers", "gym_artifacts/run/artifacts.py", "from gym_artifacts.export import engine as _planted_upward"),
    # A backend reaching past the plugin API into the core.
    ("backends-plugin-only", "exporters/phoenix.py", "from gym_artifacts.run.artifacts import RunArtifacts as _Planted"),
    # The comparison reaching into the MLflow backend's private helpers by the backends' wheel name
    # (grimp maps it to gym_artifacts._builtin_exporters, which the contract forbids).
    ("backends-by-entry-point-only", "gym_artifacts/compare/log.py",
     "from gym_artifacts._builtin_exporters._mlflow_bookkeeping import bookkeeping_of as _planted"),
    ("runtime-apart", "gym_artifacts/runtime/stats.py", "from gym_artifacts.live import fanout as _planted_live"),
    ("report-apart", "gym_artifacts/report/charts.py", "from gym_artifacts.export import engine as _planted_export"),
    ("paths-apart", "gym_artifacts/live/handle.py", "from gym_artifacts.export import status as _planted_export"),
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root`` (they come first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400", "NO_COLOR": "1"}
    return run_bounded(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def verdicts(output: str) -> dict[str, str]:
    """``{contract id: "KEPT" | "BROKEN"}`` from a report (its lines may wrap)."""
    flat = " ".join(output.split())
    out = {}
    for contract in CONTRACTS:
        name = " ".join(contract["name"].split())
        for verdict in ("KEPT", "BROKEN"):
            if f"{name} {verdict}" in flat:
                out[contract["id"]] = verdict
    return out


def test_the_checkout_keeps_every_import_contract() -> None:
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert verdicts(proc.stdout) == {c["id"]: "KEPT" for c in CONTRACTS}, proc.stdout


def test_every_contract_fails_on_a_planted_violation(tmp_path: Path) -> None:
    assert {cid for cid, _, _ in PLANTED} == {c["id"] for c in CONTRACTS}  # each contract is planted
    for folder in ("gym_artifacts", "exporters", "benchmarks"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests").mkdir()  # the contract type pyproject.toml registers
    for name in ("__init__.py", "import_contracts.py"):
        shutil.copy2(REPO / "tests" / name, tmp_path / "tests" / name)
    for _, relpath, line in PLANTED:
        fpath = tmp_path / relpath
        fpath.write_text(fpath.read_text() + f"\n{line}\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert verdicts(proc.stdout) == {c["id"]: "BROKEN" for c in CONTRACTS}, proc.stdout
    # The copy was checked, not the installed package: the report names the planted imports.
    assert "gym_artifacts.run.artifacts -> gym_artifacts.export.engine" in proc.stdout, proc.stdout
    assert "exporters.phoenix -> gym_artifacts.run.artifacts" in proc.stdout, proc.stdout
    assert "gym_artifacts.compare.log -> gym_artifacts._builtin_exporters" in proc.stdout, proc.stdout


# The only modules at the package's top: the entry points, the NeMo Gym import swap and the facade
# a backend imports. Everything else lives in a subpackage that names its part of the architecture.
TOP_LEVEL_MODULES = {"__init__", "__main__", "cli", "nemo_gym", "plugin"}


def test_the_package_is_its_subpackages_and_each_has_a_layer() -> None:
    package = REPO / "gym_artifacts"
    modules = {p.stem for p in package.glob("*.py")}
    assert modules == TOP_LEVEL_MODULES, f"flat modules outside a subpackage: {sorted(modules - TOP_LEVEL_MODULES)}"
    parts = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()} | modules - {"__init__"}
    (layers,) = [c for c in CONTRACTS if c["id"] == "layers"]
    in_layers = {name.strip() for layer in layers["layers"] for name in layer.split(":")}
    # _builtin_exporters is the wheel's name for exporters/, checked by its own contract.
    assert parts - {"_builtin_exporters"} == in_layers, "each subpackage and top module sits in exactly one layer"


def test_every_public_name_of_the_package_resolves() -> None:
    """``gym_artifacts.<name>`` for each name in ``__all__`` (loaded on first use) is there, in a
    fresh interpreter: a moved or renamed module cannot leave the public API pointing nowhere."""
    script = "import gym_artifacts as g\nfor n in g.__all__:\n    getattr(g, n)\nprint(len(g.__all__))"
    proc = run_bounded([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 10


# ``docs/architecture.md``'s tree: a line is ``NAME  job`` (two or more spaces between), nested by
# two spaces per level; a folder ends in ``/``.
TREE_LINE = re.compile(r"^(?P<indent>(?:  )*)(?P<name>[\w.]+/?) {2,}(?P<job>\S.*)$")
TREE_ROOTS = ("gym_artifacts", "exporters")


def documented_tree(markdown: str) -> tuple[dict[str, str], list[str]]:
    """The tree under ``## The tree`` as ``{path: job}`` (folders end in ``/``), and the lines
    that are not one ``NAME  job`` entry (a module without its job, a wrapped job, a bad indent)."""
    section = markdown.split("\n## The tree\n", 1)[1]
    block = section.split("```\n", 2)[1]
    entries: dict[str, str] = {}
    bad: list[str] = []
    parents: list[str] = []
    for line in block.splitlines():
        match = TREE_LINE.match(line)
        depth = len(match.group("indent")) // 2 if match else 0
        if match is None or depth > len(parents):
            bad.append(line)
            continue
        del parents[depth:]
        path = "".join(parents) + match.group("name")
        entries[path] = match.group("job")
        if path.endswith("/"):
            parents.append(match.group("name"))
    return entries, bad


def real_tree(root: Path) -> set[str]:
    """Every module of the package and of the built-in backends, and every folder holding one; a
    subpackage's ``__init__.py`` is its folder's line."""
    paths: set[str] = set()
    for top in TREE_ROOTS:
        for module in (root / top).rglob("*.py"):
            relative = module.relative_to(root)
            folders = relative.parent.parts
            paths.update("/".join(folders[: i + 1]) + "/" for i in range(len(folders)))
            if not (relative.name == "__init__.py" and len(folders) > 1):
                paths.add(relative.as_posix())
    return paths - {f"{top}/__init__.py" for top in TREE_ROOTS[1:]}


def tree_mismatch(markdown: str, root: Path) -> list[str]:
    """What the documented tree gets wrong against the files under ``root``."""
    entries, bad = documented_tree(markdown)
    real = real_tree(root)
    return (
        [f"listed but not a module: {p}" for p in sorted(set(entries) - real)]
        + [f"a module missing from the tree: {p}" for p in sorted(real - set(entries))]
        + [f"not one 'NAME  job' line: {line!r}" for line in bad]
    )


def test_the_documented_tree_is_every_module_with_its_job() -> None:
    """docs/architecture.md lists every module of gym_artifacts/ and exporters/ and nothing else,
    each with its one-line job: a new, moved or removed module must change that page."""
    assert tree_mismatch((REPO / "docs" / "architecture.md").read_text(), REPO) == []


def test_the_tree_check_catches_a_missing_an_invented_and_a_jobless_module(tmp_path: Path) -> None:
    markdown = (REPO / "docs" / "architecture.md").read_text()
    for top in TREE_ROOTS:
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "gym_artifacts" / "core" / "planted_new.py").write_text('"""A module nobody listed."""\n')
    (tmp_path / "gym_artifacts" / "run" / "torn.py").unlink()
    planted = markdown.replace(
        "    watchdog.py ", "    watchdog_old.py  a module that moved\n    watchdog.py "
    ).replace("  cli.py                   the command line", "  cli.py\n    the command line")
    assert tree_mismatch(planted, tmp_path) == [
        "listed but not a module: gym_artifacts/core/watchdog_old.py",
        "listed but not a module: gym_artifacts/run/torn.py",
        "a module missing from the tree: gym_artifacts/cli.py",
        "a module missing from the tree: gym_artifacts/core/planted_new.py",
        "not one 'NAME  job' line: '  cli.py'",
        "not one 'NAME  job' line: '    the command line: argv into one API call, and printing'",
    ]


DUPLICATES = shutil.which("duplicates")


@pytest.mark.skipif(DUPLICATES is None, reason="the `duplicates` tool is not installed here")
@pytest.mark.parametrize("package", ["gym_artifacts", "exporters"])
def test_the_product_code_repeats_no_ten_lines(package: str) -> None:
    """No run of 10 or more lines (the same, or the same shape with other names) stands twice in
    the product code: a fact or a rule written twice drifts. ``contract/`` is the backend
    contract's own rework and is left out here."""
    proc = run_bounded(
        [DUPLICATES, "--repo", package, "--min-lines", "10", "--most", "50", "--seconds", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pairs = [
        row for row in proc.stdout.splitlines()
        if re.match(r"D\d+ ", row) and not all(side.strip().startswith("contract/") for side in row.split(" ", 1)[1].split(" ~ "))
    ]  # fmt: skip
    assert "incomplete:" not in proc.stdout, proc.stdout
    assert pairs == [], proc.stdout


def test_no_two_classes_of_the_product_code_share_a_name() -> None:
    """One name, one meaning: a class name that stands in two modules (two ``Sent``, two
    ``DeadlinePassed``) makes a reader, a traceback and a failure reason ambiguous."""
    where: dict[str, list[str]] = {}
    for top in TREE_ROOTS:
        for module in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(module.read_text(), str(module))):
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(module.relative_to(REPO).as_posix())
    assert {name: places for name, places in where.items() if len(places) > 1} == {}
