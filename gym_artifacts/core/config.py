"""Configuration: YAML through OmegaConf, ``key=value`` overrides, NeMo Gym's flat keys, flags.

Nothing here resolves more of a config than it needs: a saved run config may hold
interpolations (``${oc.env:...}``) whose environment is gone, so exporter sections, flags and
upload settings are each resolved alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, TypeAdapter, ValidationError, field_validator

from gym_artifacts.core.errors import ConfigError, RunError, first_validation_error
from gym_artifacts.core.jsonio import read_yaml

DEFAULT_CONFIG_NAME = "default.yaml"

# NeMo Gym's flat keys and where they live in our layout.
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "wandb_project": ("wandb", "project"),
    "wandb_name": ("wandb", "name"),
    "wandb_api_key": ("wandb", "api_key"),
    "mlflow_tracking_uri": ("mlflow", "tracking_uri"),
    "mlflow_experiment_name": ("mlflow", "experiment_name"),
    "mlflow_run_name": ("mlflow", "run_name"),
    "mlflow_tracking_token": ("mlflow", "tracking_token"),
}
# A flat key that, present alone, turns its backend on (as NeMo Gym does).
FLAT_ENABLING_KEYS = {"wandb_project": "wandb", "mlflow_tracking_uri": "mlflow"}
UPLOAD_KEY = "upload_rollouts"
DEPRECATED_UPLOAD_KEY = "upload_rollouts_to_wandb"

# Every top-level key an export config (``-c FILE``) may hold; a run's own saved config may hold anything.
EXPORT_CONFIG_KEYS = frozenset(
    {"exporters", UPLOAD_KEY, DEPRECATED_UPLOAD_KEY, "resume", *FLAT_KEYS, *FLAT_ENABLING_KEYS}
)


def eval_config_only(config: Any) -> Any:
    """The eval's own config as backends show it (params): without this tool's settings.

    ``exporters.*``, NeMo Gym's flat exporter keys, ``upload_rollouts`` and ``resume`` say where
    the run goes, not what the eval did; they stay in the files, not in the run's params.
    """
    if not isinstance(config, dict):
        return config
    return {k: v for k, v in config.items() if k not in EXPORT_CONFIG_KEYS}


def check_export_config_keys(cfg: Any, source: str) -> None:
    """Refuse an unknown top-level key of an export config, suggesting the closest known one."""
    from gym_artifacts.core.suggest import did_you_mean

    for key in raw_container(cfg) if cfg is not None else {}:
        if key in EXPORT_CONFIG_KEYS:
            continue
        known = ", ".join(sorted(EXPORT_CONFIG_KEYS))
        hint = did_you_mean(str(key), EXPORT_CONFIG_KEYS) or f"; known keys: {known}"
        raise ConfigError(f"{source}: unknown key {key!r}{hint}")


# Top-level keys whose value must read as a boolean (checked before any run is read).
EXPORT_CONFIG_FLAGS = (UPLOAD_KEY, DEPRECATED_UPLOAD_KEY, "resume")


def check_export_config(cfg: Any, source: str) -> None:
    """The one validation of a ``-c`` file, a config mapping and ``key=value`` overrides alike:
    unknown top-level keys are refused (with the closest known one), and so is a flag
    (``upload_rollouts``, ``resume``) that is not a boolean. An interpolation is left to
    the run (its environment decides)."""
    check_export_config_keys(cfg, source)
    raw = raw_container(cfg) if cfg is not None else {}
    for key in EXPORT_CONFIG_FLAGS:
        value = raw.get(key)
        if value is not None and not (isinstance(value, str) and "${" in value):
            try:
                parse_flag(value, key)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from exc


_BOOL = TypeAdapter(bool)
SettingsT = TypeVar("SettingsT", bound=BaseModel)


class ExporterConfig(BaseModel):
    """Settings every backend shares; a backend's own model adds its keys.

    Unknown keys are refused so that a typo is reported, not silently ignored.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False

    @field_validator("enabled", mode="before")
    @classmethod
    def _flag_as_parse_flag_reads_it(cls, value: Any) -> Any:
        """' on ' reads true here too, as ``parse_flag`` (which picks the exporters) reads it."""
        return value.strip() if isinstance(value, str) else value


def _report_switch(value: Any) -> Any:
    """YAML reads ``off`` (and ``no``, ``false``) as False: that is ``off``; True is the default."""
    if isinstance(value, bool):
        return "after" if value else "off"
    return value


# When a backend that writes the run's HTML report builds it (``exporters.<backend>.report``):
# after the export's receipt in the exporting process, in a detached process the export does not
# wait for, or never (``gym-artifacts report`` builds it). Off the export's critical path always.
ReportWhen = Annotated[Literal["after", "background", "off"], BeforeValidator(_report_switch)]


def _omegaconf() -> Any:
    import omegaconf

    return omegaconf


def parse_flag(value: Any, key: str) -> bool:
    """A boolean read the way a validated config reads it: "false", "0", "no" are false."""
    try:
        return _BOOL.validate_python(value.strip() if isinstance(value, str) else value)
    except ValidationError as exc:
        raise ConfigError(f"{key}: {value!r} is not a boolean (use true/false)") from exc


def load_yaml_config(fpath: Path | str) -> Any:
    """A DictConfig from a YAML file; errors name the file and line (the run's YAML reader's)."""
    oc = _omegaconf()
    fpath = Path(require_path_arg(fpath, "config"))
    if not fpath.exists():
        raise ConfigError(f"{fpath}: config file not found")
    try:
        data = read_yaml(fpath, "config")
    except RunError as exc:
        raise ConfigError(str(exc)) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{fpath}: a config must be a YAML mapping, not {type(data).__name__}")
    from gym_artifacts.core.secrets import warn_short_secrets

    warn_short_secrets(data, str(fpath))
    try:
        return oc.OmegaConf.create(data)
    except oc.errors.OmegaConfBaseException as exc:
        raise ConfigError(f"{fpath}: invalid config: {_oc_message(exc)}") from exc


def _oc_message(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def default_config_fpath() -> Path:
    """The embedded default: inside the installed package, or ``configs/`` of a checkout."""
    package = Path(__file__).resolve().parents[1]  # gym_artifacts/ (this module is core/config.py)
    packaged = package / "configs" / DEFAULT_CONFIG_NAME
    if packaged.is_file():
        return packaged
    return package.parent / "configs" / DEFAULT_CONFIG_NAME


_default_read: tuple[tuple[str, int, int], Any] | None = None  # (the file's stat key, its config)


def load_default_config() -> Any:
    """The embedded default config (local directory + MLflow on SQLite), a fresh copy each call:
    read once per process (every export and report asks for it; the packaged file does not
    change), again only when its stat key changes (a checkout's ``configs/`` being edited)."""
    global _default_read
    fpath = default_config_fpath()
    try:
        st = fpath.stat()
        key = (str(fpath), st.st_mtime_ns, st.st_size)
    except OSError:
        return load_yaml_config(fpath)  # says what is wrong with it
    if _default_read is None or _default_read[0] != key:
        _default_read = key, load_yaml_config(fpath)
    return _omegaconf().OmegaConf.create(_default_read[1])


def parse_overrides(overrides: Sequence[str]) -> Any:
    """``key=value`` dotlist overrides as a DictConfig; a malformed one is named."""
    oc = _omegaconf()
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"override {item!r}: expected key=value")
    try:
        parsed = oc.OmegaConf.from_dotlist(list(overrides))
    except oc.errors.OmegaConfBaseException as exc:
        raise ConfigError(f"invalid override: {_oc_message(exc)}") from exc
    from gym_artifacts.core.secrets import warn_short_secrets

    warn_short_secrets(oc.OmegaConf.to_container(parsed, resolve=False), "override")
    return parsed


def merge_configs(*configs: Any) -> Any:
    """Merge DictConfigs left to right, interpolations kept as written."""
    oc = _omegaconf()
    try:
        return oc.OmegaConf.merge(*configs)
    except oc.errors.OmegaConfBaseException as exc:
        raise ConfigError(f"cannot apply overrides: {_oc_message(exc)}") from exc


def as_config(cfg: Any) -> Any:
    """A DictConfig of ``cfg`` (a DictConfig, a mapping or None)."""
    oc = _omegaconf()
    if oc.OmegaConf.is_config(cfg):
        return cfg
    try:
        return oc.OmegaConf.create(dict(cfg or {}))
    except (TypeError, ValueError, oc.errors.OmegaConfBaseException) as exc:
        raise ConfigError(f"a config must be a mapping: {_oc_message(exc)}") from exc


def raw_container(cfg: Any) -> dict[str, Any]:
    """The config as plain containers, interpolations unresolved; ConfigError unless a mapping."""
    raw = _omegaconf().OmegaConf.to_container(as_config(cfg), resolve=False)
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a mapping of settings, not a {type(raw).__name__}")
    return raw


def normalize(cfg: Any) -> Any:
    """Fold NeMo Gym's flat keys into ``exporters.<name>`` (explicit sections win), unresolved."""
    oc = _omegaconf()
    raw = raw_container(cfg)
    exporters = raw.get("exporters")
    if exporters is None:
        exporters = {}
    if not isinstance(exporters, dict):
        raise ConfigError("exporters: must be a mapping of backend name to settings")
    for name, section in exporters.items():
        if section is None:
            exporters[name] = {}
        elif not isinstance(section, dict):
            raise ConfigError(f"exporters.{name}: must be a mapping of settings, not {section!r}")
    for flat_key, (backend, key) in FLAT_KEYS.items():
        if flat_key in raw and raw[flat_key] is not None:
            section = exporters.setdefault(backend, {})
            section.setdefault(key, raw[flat_key])
    for flat_key, backend in FLAT_ENABLING_KEYS.items():
        if raw.get(flat_key) not in (None, "") and "enabled" not in exporters[backend]:
            exporters[backend]["enabled"] = True
    raw["exporters"] = exporters
    for flat_key in FLAT_KEYS:
        raw.pop(flat_key, None)
    return oc.OmegaConf.create(raw)


def configures_exporters(cfg: Any) -> bool:
    """Whether a (saved run) config says where its run should be exported."""
    raw = raw_container(cfg)
    if isinstance(raw.get("exporters"), dict) and raw["exporters"]:
        return True
    return any(raw.get(k) not in (None, "") for k in FLAT_ENABLING_KEYS)


def select(cfg: Any, key: str) -> Any:
    """One value resolved alone (only what it references is evaluated).

    The one place a setting is resolved: whatever resolution raises (a variable that is gone,
    an interpolation cycle, a resolver's own error, a chain past the recursion limit) becomes
    a ConfigError naming the key, which the CLI reports as that backend's FAILED and the live
    path as a skipped backend.
    """
    oc = _omegaconf()
    try:
        value = oc.OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        if isinstance(value, oc.Container):
            return oc.OmegaConf.to_container(value, resolve=True)
    except Exception as exc:
        raise ConfigError(f"{key}: cannot resolve: {_oc_message(exc)}") from exc
    return value


def has_key(cfg: Any, key: str) -> bool:
    """Whether ``key`` (dotted) is present, without evaluating it."""
    node: Any = raw_container(cfg)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def exporter_names(cfg: Any) -> list[str]:
    """Every backend the (normalized) config has a section for."""
    raw = raw_container(cfg)
    return sorted((raw.get("exporters") or {}).keys())


def is_enabled(cfg: Any, name: str) -> bool:
    """The ``exporters.<name>.enabled`` flag, resolved alone and read as the validated config does."""
    key = f"exporters.{name}.enabled"
    if not has_key(cfg, key):
        return False
    return parse_flag(select(cfg, key), key)


def enabled_exporters(cfg: Any, unresolvable: list[tuple[str, str]] | None = None) -> list[str]:
    """Names of the backends the config turns on.

    An ``enabled`` flag that cannot be resolved raises ConfigError, or, given ``unresolvable``,
    is appended there as ``(name, reason)`` and the backend left out.
    """
    names = []
    for name in exporter_names(cfg):
        key = f"exporters.{name}.enabled"
        if not has_key(cfg, key):
            continue
        try:
            value = select(cfg, key)
        except ConfigError as exc:
            if unresolvable is None:
                raise
            unresolvable.append((name, str(exc)))
            continue
        if parse_flag(value, key):  # a flag that is not a boolean: ConfigError in any case
            names.append(name)
    return names


def exporter_section(cfg: Any, name: str) -> dict[str, Any]:
    """The resolved settings of one backend (only this section is evaluated)."""
    key = f"exporters.{name}"
    if not has_key(cfg, key):
        return {}
    value = select(cfg, key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping of settings")
    return value


def require_path_arg(value: Any, what: str) -> str:
    """``value`` as a path string; ConfigError (the CLI's exit 2) for anything but a str or PathLike."""
    import os

    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{what}: expected a path (str or os.PathLike), not {type(value).__name__}")
    return os.fspath(value)


def unknown_setting(model: type[BaseModel], name: str, key: Any) -> str:
    """The message for a setting that ``exporters.<name>`` does not have."""
    from gym_artifacts.core.suggest import did_you_mean

    known = sorted(model.model_fields)
    hint = did_you_mean(str(key), known)
    return f"exporters.{name}.{key}: unknown setting{hint} (known: {', '.join(known)})"


def validate_settings(model: type[SettingsT], section: dict[str, Any], name: str) -> SettingsT:
    """Validated backend settings; the error names the key and why it is wrong."""
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        loc, msg, kind = first_validation_error(exc)
        if kind == "extra_forbidden":
            raise ConfigError(unknown_setting(model, name, loc)) from exc
        raise ConfigError(f"exporters.{name}.{loc}: {msg}") from exc


def upload_rollouts_setting(cfg: Any) -> bool | None:
    """The config's own upload setting, or None when it has none.

    The canonical key wins; the deprecated one is then never evaluated.
    """
    for key in (UPLOAD_KEY, DEPRECATED_UPLOAD_KEY):
        if has_key(cfg, key):
            value = select(cfg, key)
            if value is not None:
                return parse_flag(value, key)
    return None


def resolve_upload_rollouts(explicit: bool | None, *configs: Any, default: Any = True) -> Any:
    """The upload setting: an explicit choice, else the first config that sets one, else ``default``."""
    if explicit is not None:
        return explicit
    for cfg in configs:
        if cfg is None:
            continue
        value = upload_rollouts_setting(cfg)
        if value is not None:
            return value
    return default


# A plain node reference, ``${a.b}`` (absolute): what an interpolation chain is made of.
_NODE_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w\-]*(?:\.[A-Za-z_0-9][\w\-]*)*)\}")


def _escaped(text: str) -> str:
    """``text`` as an OmegaConf literal: ``${`` is not interpolated again."""
    return text.replace("${", "\\${")


def _interpolated_leaves(node: Any, prefix: str, out: dict[str, tuple[Any, Any, str]]) -> None:
    """``{dotted path: (parent node, key, text as written)}`` of every interpolated leaf."""
    oc = _omegaconf()
    raw = oc.OmegaConf.to_container(node, resolve=False)
    items = raw.items() if isinstance(raw, dict) else enumerate(raw)
    for key, value in items:
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict | list):
            _interpolated_leaves(node._get_node(key), path, out)
        elif isinstance(value, str) and "${" in value:
            out[path] = (node, key, value)


def resolve_tolerant(cfg: Any) -> Any:
    """The config resolved for display: any value that cannot be resolved is kept as written.

    Linear in the config's size: each interpolated leaf is resolved once, after the leaves it
    references (a depth-first order over plain ``${a.b}`` references, kept on an explicit
    stack), then replaced in a working copy by its value, or by its text as written when it
    cannot be resolved; a chain of 2,000 links thus costs 2,000 one-step resolutions, not
    2,000 walks of the chain.
    """
    oc = _omegaconf()
    try:
        return oc.OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an unresolvable value, a cycle, a chain past the recursion limit
        pass
    work = oc.OmegaConf.create(oc.OmegaConf.to_container(cfg, resolve=False))
    leaves: dict[str, tuple[Any, Any, str]] = {}
    _interpolated_leaves(work, "", leaves)
    done: set[str] = set()
    failed: set[str] = set()
    for root in leaves:
        stack, entered = [root], set()
        while stack:
            path = stack[-1]
            if path in done:
                stack.pop()
                continue
            if path not in entered:  # first its references, then itself
                entered.add(path)
                refs = [r for r in _NODE_REFERENCE.findall(leaves[path][2]) if r in leaves and r not in done]
                stack.extend(r for r in refs if r not in entered)
                continue
            stack.pop()
            done.add(path)
            parent, key, written = leaves[path]
            try:
                if any(r in failed for r in _NODE_REFERENCE.findall(written)):
                    raise ValueError("references a value that cannot be resolved")
                value = parent[key]
            except Exception:  # unresolvable, or a cycle: kept as written
                failed.add(path)
                parent[key] = _escaped(written)
                continue
            if isinstance(value, str):
                parent[key] = _escaped(value)
            elif not isinstance(value, oc.Container):
                parent[key] = value
    try:
        return oc.OmegaConf.to_container(work, resolve=True)
    except Exception:
        return oc.OmegaConf.to_container(work, resolve=False)


def build_export_config(
    config_fpath: Path | str | None,
    saved_config: Any | None,
    overrides: Iterable[str] = (),
    file_config: Any | None = None,
) -> tuple[Any, str]:
    """Which exporters and settings an export uses, and where they came from.

    ``file_config``: the content of ``config_fpath`` when the caller already read it (it is
    then not read again).

    The one precedence rule of every setting (later wins), shared by the CLI and the API:

    1. the embedded default;
    2. the run's saved config: when it configures any exporter, its exporters replace the
       default's (a run goes where it was meant to go);
    3. ``-c FILE``: its exporters replace both;
    4. ``key=value`` overrides, merged key by key;
    5. flags (``-e``, ``--[no-]upload-rollouts``, ``--[no-]certify``, ``--verify``): the
       arguments of ``export_run``.

    NeMo Gym's flat keys (``mlflow_tracking_uri``, ...) belong to the layer they are written
    in: within one layer an explicit ``exporters.<name>`` key wins over a flat key, and a flat
    key in a later layer (a ``key=value`` override) wins over every earlier layer's sections.
    ``upload_rollouts`` is taken from the latest layer that sets it.
    """
    default = load_default_config()
    file_cfg = file_config
    if file_cfg is None and config_fpath is not None:
        file_cfg = load_yaml_config(config_fpath)
    if file_cfg is not None:
        base, source = file_cfg, str(config_fpath)
    elif saved_config is not None and configures_exporters(saved_config):
        base, source = saved_config, "run config"
    else:
        base, source = default, "embedded default"
    cfg = normalize(base)
    upload = resolve_upload_rollouts(None, file_cfg, saved_config, default, default=None)
    if upload is not None:
        cfg = merge_configs(cfg, _omegaconf().OmegaConf.create({UPLOAD_KEY: upload}))
    overrides = list(overrides)
    if overrides:
        cfg = merge_configs(cfg, normalize(parse_overrides(overrides)))
    return cfg, source


def is_resume(cfg: Any) -> bool:
    """The ``resume`` flag (false when absent)."""
    if not has_key(cfg, "resume"):
        return False
    value = select(cfg, "resume")
    return False if value is None else parse_flag(value, "resume")
