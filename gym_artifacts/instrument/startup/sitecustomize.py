"""``gym-artifacts instrument``'s start-up hook: NeMo Gym's exporter module becomes gym-artifacts'.

This folder is put first on ``PYTHONPATH`` by ``gym-artifacts instrument -- COMMAND`` (see
``gym_artifacts/instrument/command.py``), so every Python process of that command (and of its children,
which inherit the environment: NeMo Gym's servers, Ray's workers) imports this module at start-up
(``site`` imports ``sitecustomize``). It does two cheap things and imports nothing of
gym-artifacts until NeMo Gym asks for its exporters:

1. puts a finder on ``sys.meta_path`` under which ``import nemo_gym.exporters`` (and ``from
   nemo_gym.exporters import setup_exporters``) gives ``gym_artifacts.nemo_gym`` itself (the same
   module object, in ``sys.modules`` under both names). Where gym-artifacts is not installed in
   this interpreter (a NeMo Gym server's own venv), it says so once on stderr and NeMo Gym's own
   module loads;
2. runs the ``sitecustomize`` this one hides (the next one on ``sys.path``: a distribution's or
   the user's), so instrumenting never drops a site hook.

Nothing is written anywhere: the hook lives as long as the environment variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence

TARGET = "nemo_gym.exporters"  # NeMo Gym's exporter module (bound by name in its own code)
REPLACEMENT = "gym_artifacts.nemo_gym"  # the drop-in with the same functions
MARKER = "gym_artifacts_instrument_site"  # a file beside this one: "a folder of this hook"
NOT_INSTALLED = (
    "gym-artifacts instrument: gym-artifacts is not installed in this Python ({python}); "
    "NeMo Gym's own exporters are used in this process (pip install gym-artifacts into NeMo Gym's "
    "environment to log through gym-artifacts here)"
)


class GymArtifactsExporterAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``nemo_gym.exporters`` -> ``gym_artifacts.nemo_gym`` (one module under two names)."""

    warned = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        if importlib.util.find_spec(REPLACEMENT.split(".")[0]) is None:
            if not GymArtifactsExporterAlias.warned:
                GymArtifactsExporterAlias.warned = True
                print(NOT_INSTALLED.format(python=sys.executable), file=sys.stderr)
            return None  # NeMo Gym's own module, found by the finders after this one
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a placeholder; exec_module puts the drop-in in its place

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system hands back whatever sys.modules holds under the name once this
        # returns (and binds that as ``nemo_gym.exporters``): the drop-in module itself.
        sys.modules[TARGET] = importlib.import_module(REPLACEMENT)


def _install_alias() -> None:
    if not any(type(f).__name__ == GymArtifactsExporterAlias.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, GymArtifactsExporterAlias())


def _run_hidden_sitecustomize() -> None:
    """The ``sitecustomize`` Python would have imported without this folder on the path."""
    path = [p for p in sys.path if not os.path.isfile(os.path.join(p or os.curdir, MARKER))]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install_alias()
_run_hidden_sitecustomize()
