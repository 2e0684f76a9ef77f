"""The run's config: read (``OUT_config.yaml``, or a reactor folder's ``derived_config.json``), saved
when the eval saved none, and resolved and masked for backends; read once per export
(``run_config_of_export``)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.config import eval_config_only, load_yaml_config, raw_container, resolve_tolerant
from gym_artifacts.core.errors import ConfigError, RunError
from gym_artifacts.core.secrets import (
    collect_secret_values,
    keep_env_interpolations,
    mask_secrets,
    remember_secrets,
)
from gym_artifacts.run.layout import DERIVED_CONFIG

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts


# The run config an export read at its top, while that export sends (``run_config_of_export``).
_EXPORT_RUN_CONFIG: ContextVar[tuple[Path, Any] | None] = ContextVar("export_run_config", default=None)


@contextlib.contextmanager
def run_config_of_export(run: RunArtifacts, run_config: Any | None) -> Iterator[None]:
    """While an export sends ``run``: ``load_run_config(run)`` answers with (a copy of) the config
    the export already read, so a backend naming its run or a report does not read it again."""
    token = _EXPORT_RUN_CONFIG.set((run.stem, run_config))
    try:
        yield
    finally:
        _EXPORT_RUN_CONFIG.reset(token)


def load_run_config(run: RunArtifacts) -> Any | None:
    """The run's config as a DictConfig (interpolations unresolved), or None.

    ``OUT_config.yaml`` when the run has one; else the artifacts folder's ``derived_config.json``
    (a reactor-style folder's only config), taken literally: its strings are never interpolated.
    During an export of ``run``, the config that export read (a copy: callers may change it).
    """
    known = _EXPORT_RUN_CONFIG.get()
    if known is not None and known[0] == run.stem:
        return copy.deepcopy(known[1])
    if run.has_rollouts_file and run.config_fpath.is_file():
        try:
            return load_yaml_config(run.config_fpath)
        except ConfigError as exc:
            raise RunError(str(exc)) from exc
    derived = run.artifacts_dpath / DERIVED_CONFIG
    if not derived.is_file():
        return None
    from omegaconf import OmegaConf

    from gym_artifacts.core.jsonio import read_json

    data = read_json(derived, "derived config JSON")
    if not isinstance(data, dict) or not data:
        return None
    return OmegaConf.create(_literal(data))


def _literal(value: Any) -> Any:
    """JSON as OmegaConf takes it literally: ``${`` escaped so nothing is interpolated."""
    if isinstance(value, dict):
        return {str(k): _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if isinstance(value, str) and "${" in value:
        return value.replace("${", "\\${")
    return value


def save_run_config(run: RunArtifacts, config: Any) -> bool:
    """Write ``OUT_config.yaml`` as given (``${...}`` unresolved) when the eval saved none.

    NeMo Gym saves no config beside its output; without one a run exports with no params and
    the config's destinations are unknown. The file may hold literal secrets, so it is readable
    by its owner only; every export masks it. Never raises: a run without it still exports.
    """
    if not run.has_rollouts_file or run.config_fpath.exists():
        return False
    try:
        from omegaconf import OmegaConf

        from gym_artifacts.core.atomic import atomic_write_bytes

        text = OmegaConf.to_yaml(config if OmegaConf.is_config(config) else OmegaConf.create(config or {}))
        atomic_write_bytes(run.config_fpath, text.encode("utf-8"))
        run.config_fpath.chmod(0o600)
    except Exception as exc:  # the eval must not fail for a config copy
        import logging

        logging.getLogger(__name__).warning("the run's config was not saved to %s: %s", run.config_fpath, exc)
        return False
    return True


def backend_config(run_config: Any | None) -> tuple[dict[str, Any] | None, frozenset[str]]:
    """The run config for backends (resolved where possible, masked) and the secrets it held."""
    if run_config is None:
        return None, frozenset()
    resolved = resolve_tolerant(run_config)
    shown, env_secrets = keep_env_interpolations(raw_container(run_config), resolved)
    secrets = frozenset(collect_secret_values(resolved) | env_secrets)
    remember_secrets(secrets)
    return mask_secrets(eval_config_only(shown), secrets), secrets


def dump_yaml(content: Any) -> bytes:
    """YAML text of plain containers, keys in their order."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(content, Dumper=dumper, sort_keys=False, allow_unicode=True).encode()


