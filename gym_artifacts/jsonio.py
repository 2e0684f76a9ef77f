"""Reading JSON, JSONL and YAML files with errors that name the file and the line."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gym_artifacts.errors import RunError


def _line_col(data: bytes, pos: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, pos) + 1
    col = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return line, col


def loads_lenient(data: bytes) -> Any:
    """Parse one JSON document; NaN, Infinity and integers past 64 bits are accepted as Python does."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8"))


def read_json(fpath: Path | str, what: str = "JSON") -> Any:
    """The parsed content of a JSON file, or a RunError naming the file, line and column."""
    fpath = Path(fpath)
    try:
        data = fpath.read_bytes()
    except OSError as exc:
        raise RunError(f"{fpath}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        return loads_lenient(data)
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        raise RunError(f"{fpath}:{line}:{col}: {what} is not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise RunError(f"{fpath}:{exc.lineno}:{exc.colno}: invalid {what}: {exc.msg}") from exc


MAX_LINE_BYTES = 256 << 20


def read_line(fh: Any, fpath: Path | str, lineno: int) -> bytes:
    """The next line, refusing (with file and line) one too long to hold in memory."""
    raw: bytes = fh.readline(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES:
        raise RunError(
            f"{fpath}:{lineno}: line is longer than {MAX_LINE_BYTES >> 20} MiB; refusing to load it"
        )
    return raw


def iter_jsonl(fpath: Path | str, what: str = "JSONL", end: int | None = None) -> Iterator[tuple[int, Any]]:
    """Stream ``(line number, record)`` pairs; blank lines are skipped; bad lines raise RunError.

    ``end``, when given, stops before the line starting at that offset (a torn last line).
    """
    fpath = Path(fpath)
    try:
        fh = open(fpath, "rb")  # noqa: SIM115 - closed by the ``with`` below, after the error check
    except OSError as exc:
        raise RunError(f"{fpath}: cannot read {what}: {exc.strerror or exc}") from exc
    with fh:
        lineno = 0
        while (end is None or fh.tell() < end) and (raw := read_line(fh, fpath, lineno + 1)):
            lineno += 1
            if not raw.strip():
                continue
            yield lineno, parse_jsonl_line(raw, fpath, lineno, what)


def parse_jsonl_line(raw: bytes, fpath: Path | str, lineno: int, what: str = "JSONL") -> Any:
    """One JSONL record, or a RunError naming the file and line."""
    try:
        return loads_lenient(raw)
    except UnicodeDecodeError as exc:
        raise RunError(f"{fpath}:{lineno}: {what} line is not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise RunError(f"{fpath}:{lineno}:{exc.colno}: invalid {what} line: {exc.msg}") from exc


_ORJSON_CANONICAL = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _has_nonfinite(obj: Any) -> bool:
    if isinstance(obj, float):
        return not math.isfinite(obj)
    if isinstance(obj, dict):
        return any(_has_nonfinite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_has_nonfinite(v) for v in obj)
    return False


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy scalars
    if callable(item):
        return item()
    return str(obj)


def _stdlib_canonical(obj: Any) -> bytes:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)
    return text.encode("utf-8")


def canonical_json(obj: Any) -> bytes:
    """The canonical bytes of a JSON value: sorted keys, no insignificant white space.

    NaN and infinities are kept (as Python's json writes them), never turned into null.
    """
    if _has_nonfinite(obj):
        return _stdlib_canonical(obj)
    try:
        return orjson.dumps(obj, option=_ORJSON_CANONICAL)
    except (orjson.JSONEncodeError, TypeError):
        return _stdlib_canonical(obj)


def canonical_record(raw: bytes, fpath: Path | str, lineno: int, what: str = "JSONL") -> bytes:
    """The canonical bytes of one JSONL line, or a RunError naming the file and line."""
    try:
        return orjson.dumps(orjson.loads(raw), option=_ORJSON_CANONICAL)
    except orjson.JSONDecodeError:
        pass
    except orjson.JSONEncodeError:
        return _stdlib_canonical(orjson.loads(raw))
    return _stdlib_canonical(parse_jsonl_line(raw, fpath, lineno, what))


def json_safe(value: Any) -> Any:
    """Replace NaN and infinities by strings so that strict JSON writers accept the value."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def read_yaml(fpath: Path | str) -> Any:
    """Plain YAML content (interpolations stay as written), or a RunError with the line."""
    import yaml

    fpath = Path(fpath)
    try:
        text = fpath.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RunError(f"{fpath}: YAML is not valid UTF-8 (byte {exc.start})") from exc
    except OSError as exc:
        raise RunError(f"{fpath}: cannot read YAML: {exc.strerror or exc}") from exc
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise RunError(yaml_error_message(fpath, exc)) from exc


def yaml_error_message(fpath: Path | str, exc: Exception) -> str:
    """``file:line:col: problem`` for a PyYAML error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{fpath}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}"
    return f"{fpath}: invalid YAML: {problem}"
