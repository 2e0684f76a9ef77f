"""gym-artifacts as one exporter plugin of NeMo Gym, for the entry-point group NeMo Gym proposes.

NVIDIA-NeMo/Gym issue #2989 proposes discovering exporters through a ``nemo_gym.exporters``
entry-point group, each plugin providing "an exporter class and configuration model", as NeMo
Gym's built-in registry pairs each backend with a config model whose ``is_available`` decides
whether it opens (``nemo_gym/exporters/__init__.py`` 0.7.0). This module is that pair:

* ``GymArtifactsConfig``: available when the global config has a ``gym_artifacts`` section
  (this project's config: ``gym_artifacts.exporters.<name>...``, e.g.
  ``+gym_artifacts.exporters.local.root=results/runs``). NeMo Gym's own flat keys
  (``wandb_*``, ``mlflow_*``, ``langsmith_*``) stay its own exporters': they open nothing here,
  so nothing is logged twice;
* ``GymArtifactsExporter``: NeMo Gym's ``BaseExporter`` surface (``setup``, ``teardown``,
  ``export_config``, ``export_metrics``, ``export_rollouts``) over the drop-in
  (``gym_artifacts.nemo_gym``): the same backend runs and metrics journal, the same export after.

A backend named in the section is on unless it says ``enabled: false``; a section that opens no
backend fails ``setup`` (NeMo Gym then skips this exporter with a warning and keeps the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from gym_artifacts import nemo_gym

SECTION = "gym_artifacts"


class GymArtifactsConfig(BaseModel):
    """NeMo Gym's ``ExporterConfig`` shape: read from the global config, ``is_available``."""

    model_config = ConfigDict(extra="ignore")

    gym_artifacts: dict[str, Any] | None = None

    @property
    def is_available(self) -> bool:
        return bool(self.gym_artifacts)


def plugin_config(global_config_dict: Any) -> dict[str, Any]:
    """The drop-in's config: the global config without NeMo Gym's own exporters' flat keys, with
    the ``gym_artifacts`` section's settings on top (each backend it names on by default)."""
    plain = nemo_gym.plain_config(global_config_dict)
    section = plain.pop(SECTION, None)
    section = dict(section) if isinstance(section, Mapping) else {}
    config = {k: v for k, v in plain.items() if k not in nemo_gym.FLAT_KEYS}
    named = section.pop("exporters", None)
    exporters: dict[str, Any] = {name: {"enabled": False} for name in nemo_gym.NEMO_GYM_BACKENDS}
    for name, settings in (named.items() if isinstance(named, Mapping) else ()):
        settings = dict(settings) if isinstance(settings, Mapping) else {}
        settings.setdefault("enabled", True)
        exporters[name] = settings
    return {**config, **section, "exporters": exporters}


class GymArtifactsExporter:
    """gym-artifacts' backends as one NeMo Gym exporter (never raises from a logging call)."""

    name: ClassVar[str] = "gym_artifacts"
    config_model: ClassVar[type[GymArtifactsConfig]] = GymArtifactsConfig

    def __init__(self, global_config_dict: Any) -> None:
        self.global_config_dict = global_config_dict

    def setup(self) -> None:
        """Open the section's backends (the config is logged to them as they open)."""
        if not nemo_gym.setup_exporters(plugin_config(self.global_config_dict)):
            raise RuntimeError(f"gym-artifacts: no backend of the {SECTION!r} section opened")

    def teardown(self) -> None:
        nemo_gym.teardown_exporters()

    def export_config(self) -> None:
        """Nothing more: setup already logged the config (masked) to every backend."""

    def export_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        nemo_gym.export_metrics(metrics, step)

    def export_rollouts(self, rollouts: list[dict[str, Any]]) -> None:
        nemo_gym.export_rollouts(rollouts)

    def __enter__(self) -> GymArtifactsExporter:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()
