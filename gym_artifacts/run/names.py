"""What a run is called in a tracker: its config's run name, else its folder and stem.

NeMo Gym names every output ``rollouts.jsonl``, so the stem alone would call ten runs
``rollouts``. Order: the backend's own ``run_name``/``name`` setting (handled by the backend),
then the run config's NeMo Gym key for that backend (``mlflow_run_name``, ``wandb_name``), then
``<folder>/<stem>`` of the output file (``with-failures/rollouts``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gym_artifacts.run.artifacts import RunArtifacts

CONFIG_RUN_NAME_KEYS: dict[str, tuple[str, ...]] = {
    "mlflow": ("mlflow_run_name",),
    "wandb": ("wandb_name",),
}
ANY_RUN_NAME_KEYS = ("mlflow_run_name", "wandb_name")
NO_CONFIG_PARAMS = (
    "The run has no saved config (NeMo Gym saves none beside its output): it exports with the "
    "params its rollouts tell (below), under the exporters' settings of the config given to the "
    "export, and is named after its folder and stem. `export --run-config FILE` logs NeMo Gym's "
    "own resolved config instead."
)
NO_CONFIG = (
    "The run has no saved config (NeMo Gym saves none beside its output): it exports with no "
    "params, under the exporters' settings of the config given to the export, and is named after "
    "its folder and stem. The live layer saves OUT_config.yaml when the eval did not."
)


def _config_name(config: Any, keys: Sequence[str]) -> str | None:
    if config is None:
        return None
    for key in keys:
        try:
            value = config.get(key)
        except Exception:  # an unresolvable interpolation: no name from it
            value = None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def default_run_name(run: RunArtifacts) -> str:
    """``<folder>/<stem>`` of the output (the stem alone for a run in the file system root); a
    name's undecodable bytes (``r\xe9sultats`` on a UTF-8 system) as escapes: text a tracker
    stores."""
    from gym_artifacts.core.jsonio import escaped_text

    folder = run.stem.parent.name
    return escaped_text(f"{folder}/{run.stem.name}" if folder else run.stem.name)


def run_name(run: RunArtifacts, config: Any, backend: str) -> str:
    """The run's name in ``backend`` from the run config (a mapping or DictConfig) or its path."""
    keys = CONFIG_RUN_NAME_KEYS.get(backend, ANY_RUN_NAME_KEYS)
    return _config_name(config, keys) or default_run_name(run)


def saved_config_run_name(run: RunArtifacts, backend: str) -> str:
    """The run's name from its saved ``OUT_config.yaml`` (a live run: the live layer saved it),
    else from its path; a config that cannot be read names nothing."""
    from gym_artifacts.core.errors import GymArtifactsError
    from gym_artifacts.run.run_config import load_run_config

    try:
        config = load_run_config(run)
    except GymArtifactsError:
        config = None
    return run_name(run, config, backend)
