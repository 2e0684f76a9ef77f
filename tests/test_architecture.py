"""The layering of ``docs/architecture.md`` is checked by a tool: ``lint-imports`` (import-linter)
runs the contracts in ``pyproject.toml`` (``[tool.importlinter]``) over this checkout and keeps
every one, and the check bites: a copy of the package with one forbidden import planted per
contract breaks each contract, named in the report.
"""

from __future__ import annotations

import os
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
