"""Files beside a run's rollouts as a backend sends them: masked copies of JSON/YAML artifacts and
NeMo Gym's sidecars (``Masker``), and the NVML summary and series as numbers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.errors import RunError
from gym_artifacts.core.flatten import flatten
from gym_artifacts.core.jsonio import iter_jsonl, metric_value
from gym_artifacts.core.secrets import (
    mask_secrets,
)
from gym_artifacts.run.layout import NVML_SERIES, NVML_SUMMARY
from gym_artifacts.run.run_config import dump_yaml

if TYPE_CHECKING:
    from gym_artifacts.run.artifacts import RunArtifacts


# Gives a file's masked bytes, or None when nothing in it needs masking.
Masker = Callable[[Any, frozenset[str]], "bytes | None"]
MASKABLE_MAX_BYTES = 16 << 20


MASKABLE_SUFFIXES = (".json", ".yaml", ".yml")


def masked_artifact(fpath: Any, secrets: frozenset[str]) -> bytes | None:
    """Masked bytes of a small JSON or YAML artifact that holds a secret; None when it holds none.

    The content is masked as a config is (secret keys and secret-shaped values); the identity
    pass has already refused a file that does not parse, naming its line.
    """

    from gym_artifacts.core.jsonio import canonical_json, json_safe, read_json, read_yaml

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

    from gym_artifacts.core.secrets import redact_text

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

    from gym_artifacts.core.secrets import file_holds_any, redact_secret_values, secret_forms_as_bytes

    forms = secret_forms_as_bytes(secrets)
    if forms is not None and not file_holds_any(fpath, forms):
        return None  # the usual case, found without holding the file (it can be 50 MB)
    text = Path(fpath).read_bytes().decode("utf-8", errors="surrogateescape")
    masked = redact_secret_values(text, secrets)
    return None if masked == text else masked.encode("utf-8", errors="surrogateescape")


def nvml_summary(run: RunArtifacts) -> tuple[dict[str, float], str | None]:
    """The NVML summary's numeric figures, or ``({}, reason)`` when NVML never sampled.

    A summary with ``samples: 0`` carries no data even when its figures are zeros (as
    reactor-runtime writes them): those zeros are not reported as measurements.
    """
    fpath = run.artifacts_dpath / NVML_SUMMARY
    if not fpath.is_file():
        return {}, "no NVML summary"
    from gym_artifacts.core.jsonio import read_json

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


