"""What every backend receives from a run, in backend-neutral form.

The run config resolved as far as the environment allows and masked (the aggregate metrics'
mapping is ``gym_artifacts.aggregate``); the live metrics journal with its original steps
and times. Backends only map these onto their own API.
"""

from __future__ import annotations

import contextlib
import copy
import numbers
import tempfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.config import eval_config_only, load_yaml_config, raw_container, resolve_tolerant
from gym_artifacts.errors import ConfigError, RunError
from gym_artifacts.jsonio import iter_jsonl, metric_value
from gym_artifacts.layout import DERIVED_CONFIG, NVML_SERIES, NVML_SUMMARY
from gym_artifacts.secrets import (
    collect_secret_values,
    keep_env_interpolations,
    mask_secrets,
    remember_secrets,
)

if TYPE_CHECKING:
    from gym_artifacts.backend import ExportPlan
    from gym_artifacts.run import RunArtifacts

Scalar = int | float | bool | str | None




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

    from gym_artifacts.jsonio import read_json

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

        from gym_artifacts.atomic import atomic_write_bytes

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


def flatten(value: Any, prefix: str = "", sep: str = "/") -> dict[str, Scalar]:
    """Nested dicts and lists as ``{"a/b.0/c": leaf}``; leaves are kept as they are.

    A list index is written ``.i`` (not ``[i]``), a form every backend accepts as it is, so a
    metric has the same name in the local backend, MLflow, W&B and TensorBoard.
    """
    out: dict[str, Scalar] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if not node and path:
                return
            for key, child in node.items():
                walk(child, f"{path}{sep}{key}" if path else str(key))
        elif isinstance(node, list | tuple):
            for i, child in enumerate(node):
                walk(child, f"{path}.{i}" if path else str(i))
        else:
            out[path] = node

    walk(value, prefix)
    return out


def is_number(value: Any) -> bool:
    """A real number a tracker can plot: ints, floats, bools, numpy scalars; not strings."""
    return isinstance(value, numbers.Real)


# Gives a file's masked bytes, or None when nothing in it needs masking.
Masker = Callable[[Any, frozenset[str]], "bytes | None"]
MASKABLE_MAX_BYTES = 16 << 20


MASKABLE_SUFFIXES = (".json", ".yaml", ".yml")


def masked_artifact(fpath: Any, secrets: frozenset[str]) -> bytes | None:
    """Masked bytes of a small JSON or YAML artifact that holds a secret; None when it holds none.

    The content is masked as a config is (secret keys and secret-shaped values); the identity
    pass has already refused a file that does not parse, naming its line.
    """
    from pathlib import Path

    from gym_artifacts.jsonio import canonical_json, json_safe, read_json, read_yaml

    fpath = Path(fpath)
    if fpath.suffix.lower() not in MASKABLE_SUFFIXES or fpath.stat().st_size > MASKABLE_MAX_BYTES:
        return None
    if fpath.suffix.lower() == ".json":
        content = read_json(fpath)
        masked = canonical_json(json_safe(mask_secrets(content, secrets)))
        return masked if masked != canonical_json(json_safe(content)) else None
    content = read_yaml(fpath)
    masked_content = mask_secrets(content, secrets)
    return None if masked_content == content else dump_yaml(masked_content)


def masked_sidecar(fpath: Any, secrets: frozenset[str]) -> bytes | None:
    """Masked bytes of one of NeMo Gym's sidecars when it holds a secret; None when it holds none.

    The sidecars are NeMo Gym's own output (failures, planned inputs, quality checks): they are
    masked by value (a config secret, a credential in a URL), never by key name, since their keys
    name counts (``tokens``, ``unobserved``) that a config masker would take for credentials.
    """
    from pathlib import Path

    from gym_artifacts.secrets import redact_text

    fpath = Path(fpath)
    if fpath.stat().st_size > MASKABLE_MAX_BYTES:
        return None
    text = fpath.read_bytes().decode("utf-8", errors="surrogateescape")
    masked = redact_text(text, secrets)
    return None if masked == text else masked.encode("utf-8", errors="surrogateescape")


def masked_values(fpath: Any, secrets: frozenset[str]) -> bytes | None:
    """Masked bytes of a data file that holds one of the config's secret values; None when it
    holds none. By value only and whatever its size (aggregate metrics can be large): NeMo Gym's
    numbers and tables have no credential shapes to look for."""
    from pathlib import Path

    from gym_artifacts.secrets import redact_secret_values

    text = Path(fpath).read_bytes().decode("utf-8", errors="surrogateescape")
    masked = redact_secret_values(text, secrets)
    return None if masked == text else masked.encode("utf-8", errors="surrogateescape")


def dump_yaml(content: Any) -> bytes:
    """YAML text of plain containers, keys in their order."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(content, Dumper=dumper, sort_keys=False, allow_unicode=True).encode()


def nvml_summary(run: RunArtifacts) -> tuple[dict[str, float], str | None]:
    """The NVML summary's numeric figures, or ``({}, reason)`` when NVML never sampled.

    A summary with ``samples: 0`` carries no data even when its figures are zeros (as
    reactor-runtime writes them): those zeros are not reported as measurements.
    """
    fpath = run.artifacts_dpath / NVML_SUMMARY
    if not fpath.is_file():
        return {}, "no NVML summary"
    from gym_artifacts.jsonio import read_json

    data = read_json(fpath, "NVML summary JSON")
    if not isinstance(data, dict):
        raise RunError(f"{fpath}: NVML summary must be a JSON object")
    samples = data.get("samples")
    if not samples:
        reason = data.get("reason") or data.get("error") or "NVML recorded no samples"
        return {}, str(reason)
    figures = {}
    for key, value in flatten(data).items():
        number = metric_value(value)
        if number is not None:
            figures[key] = number
    return figures, None


@dataclass(frozen=True)
class NvmlSample:
    """One reading of one GPU from the NVML series."""

    time: float
    gpu: int
    metrics: dict[str, float]


def iter_nvml_series(run: RunArtifacts) -> Iterator[NvmlSample]:
    """The NVML series (``{"time", "gpu", "metrics"}`` lines) in file order."""
    fpath = run.artifacts_dpath / NVML_SERIES
    if not fpath.is_file():
        return
    for lineno, record in iter_jsonl(fpath, "NVML series"):
        if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
            raise RunError(f"{fpath}:{lineno}: NVML sample must be an object with 'metrics'")
        when, gpu = record.get("time"), record.get("gpu", 0)
        if metric_value(when) is None or not isinstance(gpu, int):
            raise RunError(f"{fpath}:{lineno}: NVML sample needs a numeric 'time' and an integer 'gpu'")
        values = {
            k: v for k, v in ((k, metric_value(v)) for k, v in record["metrics"].items()) if v is not None
        }
        yield NvmlSample(float(when), gpu, values)


@contextlib.contextmanager
def complete_rollouts(rollouts: Path, plan: ExportPlan) -> Iterator[Path]:
    """The rollouts file to send: itself, or a temporary copy of its complete lines when the
    user chose to leave a torn last line out."""
    torn = plan.partial_line
    if torn is None:
        yield rollouts
        return
    with tempfile.TemporaryDirectory(prefix="gym-artifacts-complete-") as tmp:
        dest = Path(tmp) / rollouts.name
        with open(rollouts, "rb") as src, open(dest, "wb") as out:
            remaining = torn.complete_bytes
            while remaining > 0:
                block = src.read(min(remaining, 1 << 20))
                if not block:
                    break
                out.write(block)
                remaining -= len(block)
        yield dest


def partial_line_record(plan: ExportPlan) -> dict[str, int]:
    """What a backend run records about a left-out torn last line (empty when none was)."""
    if plan.partial_line is None:
        return {}
    return {"omitted_partial_lines": 1, "omitted_partial_line_bytes": plan.partial_line.partial_bytes}
