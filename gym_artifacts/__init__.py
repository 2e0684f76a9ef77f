"""gym-artifacts: live-log evals to several trackers, produce runtime artifacts, export runs once.

The package root stays import-light: the public names are loaded on first use so that
``import gym_artifacts`` (and listing exporters) never pulls in pydantic-heavy modules or an SDK.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "RunArtifacts": "gym_artifacts.run.artifacts",
    "content_identities": "gym_artifacts.run.identity",
    "Exporter": "gym_artifacts.contract.exporter",
    "ExportResult": "gym_artifacts.contract.hooks",
    "ExportStatus": "gym_artifacts.contract.hooks",
    "export_run": "gym_artifacts.export.engine",
    "export_runs": "gym_artifacts.export.executors",
    "RunResults": "gym_artifacts.export.executors",
    "run_status": "gym_artifacts.export.status",
    "list_exporters": "gym_artifacts.contract.registry",
    "load_default_config": "gym_artifacts.core.config",
    "mask_secrets": "gym_artifacts.core.secrets",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'gym_artifacts' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
