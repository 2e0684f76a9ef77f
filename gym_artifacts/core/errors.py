"""Expected, user-facing errors: each carries a one-line message naming the file, key or line."""

from __future__ import annotations

from typing import Any


def first_validation_error(exc: Any) -> tuple[str, str, str]:
    """A pydantic ValidationError's first problem: ``(dotted location, message, error type)``."""
    err = exc.errors()[0]
    return ".".join(str(p) for p in err["loc"]), err["msg"], err["type"]


class GymArtifactsError(Exception):
    """Base of every error this package raises on bad input (never for a bug)."""


class ConfigError(GymArtifactsError):
    """Unusable configuration or arguments: the CLI exits with code 2."""


class ClusterError(GymArtifactsError):
    """The Ray cluster could not be started or joined (the request was fine): the CLI exits 1."""


class RunError(GymArtifactsError):
    """A run's files cannot be read faithfully (malformed, unsafe path, not ours)."""


class ReceiptError(RunError):
    """A receipt or run-id marker that is not a valid version-1 file of ours."""


class MissingRunError(RunError):
    """Nothing of the named run exists: the CLI exits with code 2 and writes nothing."""


class RunNameTooLong(MissingRunError):
    """A run whose stem cannot hold every file name it needs: refused as a missing run is
    (exit 2, nothing written)."""
