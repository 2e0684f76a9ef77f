"""Destinations: where an exporter's runs go, described stably and without credentials.

A receipt is valid for one destination only, so that a run sent to one MLflow store is sent
again, once, to another. A destination is a small JSON object (``{"tracking_uri": ...,
"experiment_name": ...}``); its *key* is a hash of its canonical form, compared by receipts.
Nothing here contacts a backend or reads a credential into the description.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import blake3

from gym_artifacts.core.jsonio import canonical_json, canonical_text, json_safe
from gym_artifacts.core.secrets import is_secret_key

Destination = dict[str, Any]


def destination_key(destination: Destination) -> str:
    """A short stable key of the destination (the same object always gives the same key).

    A path whose bytes are not UTF-8 (``os.fsdecode`` holds them as lone surrogates) is hashed
    with each surrogate as its own bytes (``surrogatepass``): never the bytes of any UTF-8 text,
    so two folders never share a key, and every UTF-8 destination keeps the key it always had.
    """
    try:
        canonical = canonical_json(destination)
    except UnicodeEncodeError:
        canonical = canonical_text(destination).encode("utf-8", "surrogatepass")
    return "d:" + blake3.blake3(canonical).hexdigest()[:24]


def resolved_path(path: str | os.PathLike[str]) -> str:
    """The folder a path names, however it is spelled: ``~`` expanded, links followed (files
    land in the link's target, so two names of one folder are one destination)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def absolute_store_uri(uri: str) -> str:
    """``sqlite:///rel.db`` made absolute (the working folder may change within a process, and
    MLflow caches a store by its URI string); any other URI is returned as it is."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path, sep, query = uri[len("sqlite:///") :].partition("?")
        return f"sqlite:///{resolved_path(path)}{sep}{query}"
    return uri


def credential_free_uri(uri: str) -> str:
    """The URI without user, password or secret query parameters; file-backed paths made absolute.

    ``https://user:pw@host/x?token=t&a=1`` -> ``https://host/x?a=1``;
    ``sqlite:///mlflow.db`` -> ``sqlite:////abs/cwd/mlflow.db``; a plain path -> its absolute form.
    """
    if "://" not in uri:
        return resolved_path(uri) if uri else uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri.split("://", 1)[0] + "://(unparsable)"
    try:
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port is not None else "")
    except ValueError:  # an invalid port: keep the host part only
        netloc = parts.hostname or ""
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, v) for k, v in pairs if not is_secret_key(k)])
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "sqlite" and not netloc and parts.path.startswith("/"):
        # sqlite:///rel.db is relative to the working folder, sqlite:////abs.db absolute.
        return f"{parts.scheme}:///{resolved_path(parts.path[1:])}" + (f"?{query}" if query else "")
    if scheme == "file" and not netloc:
        return f"file://{resolved_path(parts.path)}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), query, ""))


def dataset_service_destination(settings: Any, url_field: str) -> Destination:
    """Where an LLM-eval service (LangSmith, Phoenix) puts a run: the URL in ``url_field``
    without credentials, and the dataset and experiment names (None: named per run). The API
    key and the timeouts do not say where runs go."""
    return {
        url_field: credential_free_uri(getattr(settings, url_field)),
        "dataset_name": settings.dataset_name,
        "experiment_name": settings.experiment_name,
    }


def default_destination(settings: Any) -> Destination:
    """Every setting except ``enabled`` and secrets, JSON-safe: the default a backend may narrow.

    A third-party backend that does not override ``Exporter.destination`` gets this: two
    exports with the same settings share a destination, any differing setting makes another.
    A path setting is resolved (absolute, ``~`` expanded): ``./ledgers`` from two working
    folders is two places, and ``/abs/ledgers`` and ``ledgers/`` from ``/abs`` one.
    """
    from pydantic import SecretStr

    out: Destination = {}
    for key, value in settings:
        if key == "enabled" or is_secret_key(key) or isinstance(value, SecretStr):
            continue
        out[key] = json_safe(resolved_path(value) if isinstance(value, Path) else value)
    return out


def describe(destination: Destination | None) -> str:
    """One short line for tables: the values in order, ``unknown`` for a version-1 receipt."""
    if destination is None:
        return "unknown (version-1 receipt)"
    return " ".join(f"{k}={v}" for k, v in destination.items() if v not in (None, "", [], {}))
