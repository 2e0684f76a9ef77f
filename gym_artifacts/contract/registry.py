"""Exporter discovery through the ``gym_artifacts.exporters`` entry-point group, loaded lazily.

Listing never imports a backend's SDK: an exporter module imports its SDK only inside
functions, and whether the SDK is installed is asked of the import system without importing it.
The entry points are scanned once per process (installed distributions do not change under a
running export); ``reset_cache`` makes the next lookup scan again, for a plugin installed at
run time.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gym_artifacts.core.errors import ConfigError
from gym_artifacts.run import artifacts as run_module

if TYPE_CHECKING:
    from gym_artifacts.contract.exporter import Exporter

GROUP = "gym_artifacts.exporters"


@dataclass(frozen=True)
class ExporterEntry:
    """A registered backend: its name, where its class lives, and who provides it."""

    name: str
    target: str
    provider: str

    def load(self) -> type[Exporter]:
        """The backend's class, imported in bounded time (:func:`import_bounded`); any way the
        import fails is a ConfigError ``cannot load``."""
        module_name, _, attr = self.target.partition(":")
        try:
            obj = getattr(import_bounded(module_name), attr)
        except Exception as exc:  # a plugin's module may fail any way while it is imported
            raise ConfigError(f"exporter {self.name!r}: cannot load {self.target}: {exc}") from exc
        check_backend_class(obj, self.name, self.target)
        return obj

    def modes(self) -> str:
        """``live, post-run`` for a backend that can follow a running eval, else ``post-run only``."""
        from gym_artifacts.contract.live_exporter import LiveExporter

        return "live, post-run" if issubclass(self.load(), LiveExporter) else "post-run only"

    def sdk_installed(self) -> bool:
        """Whether the backend's SDK can be imported (asked without importing it)."""
        sdk = self.load().sdk_module
        return sdk is None or importlib.util.find_spec(sdk) is not None


LOAD_SECONDS_ENV = "GYM_ARTIFACTS_PLUGIN_LOAD_SECONDS"
DEFAULT_LOAD_SECONDS = 30.0
# Modules whose import did not finish in time: their import lock is held by a thread that may
# never return, so this process never imports them again (a second try would block on it).
_unfinished: dict[str, str] = {}


def _load_seconds() -> float:
    """The time limit for one backend module's import (``GYM_ARTIFACTS_PLUGIN_LOAD_SECONDS``)."""
    try:
        seconds = float(os.environ.get(LOAD_SECONDS_ENV, DEFAULT_LOAD_SECONDS))
    except ValueError:
        return DEFAULT_LOAD_SECONDS
    return seconds if seconds > 0 else DEFAULT_LOAD_SECONDS


def import_bounded(module_name: str) -> ModuleType:
    """Import a backend's module, isolated from the way it may misbehave while imported.

    A module not yet imported is imported in a daemon thread: ``sys.exit()``, ``SystemExit`` or
    ``KeyboardInterrupt`` raised by its code becomes a RuntimeError (it never ends this process),
    and one that does not finish within ``GYM_ARTIFACTS_PLUGIN_LOAD_SECONDS`` (it sleeps, waits
    or spins forever) is given up on: a RuntimeError, and never tried again in this process.
    A real Ctrl-C still reaches the main thread, which only waits.
    """
    if module_name in _unfinished:
        raise RuntimeError(_unfinished[module_name])
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        return module
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["module"] = importlib.import_module(module_name)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: reported, never re-raised
            outcome["error"] = exc

    seconds = _load_seconds()
    thread = threading.Thread(target=run, name=f"gym-artifacts import {module_name}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _unfinished[module_name] = (
            f"its import did not finish within {seconds:g} s ({LOAD_SECONDS_ENV}); given up on"
        )
        raise RuntimeError(_unfinished[module_name])
    error = outcome.get("error")
    if isinstance(error, SystemExit | KeyboardInterrupt):
        raise RuntimeError(f"its module raised {type(error).__name__}({error}) while imported") from None
    if error is not None:
        raise error
    return outcome["module"]


def check_backend_class(obj: object, name: str, target: str) -> None:
    """Refuse, naming what is wrong, a class that does not keep the backend contract.

    Checked when the class is loaded, so a hook left out fails before any run is opened.
    """
    from gym_artifacts.contract.exporter import Exporter
    from gym_artifacts.contract.hooks import hooks_with_wrong_signatures, missing_hooks
    from gym_artifacts.core.config import ExporterConfig
    from gym_artifacts.run.artifacts import EXPORTER_NAME_RE

    where = f"exporter {name!r}: {target}"
    if not (isinstance(obj, type) and issubclass(obj, Exporter)):
        raise ConfigError(f"{where} is not an Exporter class")
    missing = missing_hooks(obj)
    if missing:
        raise ConfigError(
            f"{where} does not implement the required hook(s) {', '.join(missing)} "
            "(see gym_artifacts.contract.hooks)"
        )
    wrong = hooks_with_wrong_signatures(obj)
    if wrong:
        raise ConfigError(f"{where}: {'; '.join(wrong)} (see gym_artifacts.contract.hooks)")
    declared = getattr(obj, "name", None)
    if declared != name:
        raise ConfigError(f"{where} has name = {declared!r}; it must equal its registered name {name!r}")
    if not EXPORTER_NAME_RE.match(name):
        raise ConfigError(f"{where}: use lower-case letters, digits, '_' or '-' (at most 64) in its name")
    model = getattr(obj, "config_model", None)
    if not (isinstance(model, type) and issubclass(model, ExporterConfig)):
        raise ConfigError(f"{where}: config_model must be an ExporterConfig subclass, not {model!r}")


_extra: dict[str, ExporterEntry] = {}
# The installed distributions' entries, scanned on first use (``reset_cache`` forgets them).
_installed: tuple[ExporterEntry, ...] | None = None


def reset_cache() -> None:
    """Forget the scanned entry points: the next lookup scans the installed distributions again
    (after installing a plugin into a running process, or in a test that changes them)."""
    global _installed
    _installed = None


def _installed_entries() -> tuple[ExporterEntry, ...]:
    """The entry points of the installed distributions, scanned once per process."""
    global _installed
    if _installed is None:
        _installed = tuple(
            ExporterEntry(ep.name, ep.value, ep.dist.name if ep.dist is not None else "unknown distribution")
            for ep in entry_points(group=GROUP)
        )
    return _installed


def register(cls: type[Exporter], provider: str = "in-process") -> None:
    """Register an exporter class at run time (tests, notebooks); a duplicate name is an error."""
    entry = ExporterEntry(cls.name, f"{cls.__module__}:{cls.__qualname__}", provider)
    check_backend_class(cls, cls.name, entry.target)
    found, clashes = _scan()
    if cls.name in clashes:
        raise ConfigError(clashes[cls.name])
    existing = found.get(cls.name)
    if existing is not None and existing.target != entry.target:
        raise ConfigError(_duplicate_message(existing, entry))
    _extra[cls.name] = entry


def unregister(name: str) -> None:
    """Forget an exporter registered with ``register``."""
    _extra.pop(name, None)


def _duplicate_message(a: ExporterEntry, b: ExporterEntry) -> str:
    return (
        f"exporter name {a.name!r} is registered twice: {a.target} (from {a.provider}) "
        f"and {b.target} (from {b.provider})"
    )


def _scan() -> tuple[dict[str, ExporterEntry], dict[str, str]]:
    """Every registered exporter by name, and the names two providers claim (with the message
    naming both). A clash makes only its own name unusable: one bad plugin must not stop the
    other backends."""
    found: dict[str, ExporterEntry] = {}
    clashes: dict[str, str] = {}
    for entry in [*_installed_entries(), *_extra.values()]:
        previous = found.get(entry.name)
        if previous is not None and previous.target != entry.target:
            clashes.setdefault(entry.name, _duplicate_message(previous, entry))
        else:
            found.setdefault(entry.name, entry)
    for name in clashes:
        found.pop(name, None)
    return found, clashes


def discover() -> dict[str, ExporterEntry]:
    """Every usable registered exporter by name; a name two providers claim is left out
    (``get_entry`` and ``list_exporters`` name both)."""
    return _scan()[0]



def _registered_names() -> list[str]:
    return sorted(discover())


# The run model checks that a run's stem has room for every registered exporter's file names.
run_module.registered_exporter_names = _registered_names


def get_entry(name: str, entries: dict[str, ExporterEntry] | None = None) -> ExporterEntry:
    """The entry for ``name``; a name registered twice names both; an unknown name lists the known ones."""
    entries = discover() if entries is None else entries
    try:
        return entries[name]
    except KeyError:
        clash = _scan()[1].get(name)
        if clash:
            raise ConfigError(clash) from None
        from gym_artifacts.core.suggest import did_you_mean

        known = ", ".join(sorted(entries)) or "none"
        hint = did_you_mean(name, entries)
        raise ConfigError(f"unknown exporter {name!r}{hint} (known: {known})") from None


def list_exporters(config: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every registered exporter, sorted by name: whether ``config`` (a YAML file, else the
    embedded default) enables it, whether its SDK is installed, its modes and its provider.

    The ``gym-artifacts exporters`` listing; imports no SDK.
    """
    from gym_artifacts.core.config import is_enabled, load_default_config, load_yaml_config, normalize

    cfg = normalize(load_yaml_config(config) if config is not None else load_default_config())
    found, clashes = _scan()
    rows = [_listing_row(name, entry, is_enabled(cfg, name)) for name, entry in found.items()]
    rows += [
        {"name": name, "enabled": is_enabled(cfg, name), "sdk_installed": False,
         "modes": f"unusable: {message}", "provider": "-", "target": "-"}
        for name, message in clashes.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda row: row["name"])


def _listing_row(name: str, entry: ExporterEntry, enabled: bool) -> dict[str, Any]:
    """One backend's listing row; a class that cannot be loaded says why instead of failing the list."""
    try:
        sdk_installed, modes = entry.sdk_installed(), entry.modes()
    except ConfigError as exc:
        sdk_installed, modes = False, f"cannot load: {exc}"
    return {"name": name, "enabled": enabled, "sdk_installed": sdk_installed, "modes": modes,
            "provider": entry.provider, "target": entry.target}  # fmt: skip
