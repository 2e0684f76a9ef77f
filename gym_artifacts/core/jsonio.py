"""Reading JSON, JSONL and YAML files with errors that name the file and the line, and the generic
helpers every layer uses on what they hold (``count_lines``, ``metric_value``)."""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gym_artifacts.core.errors import RunError


def _line_col(data: bytes, pos: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, pos) + 1
    col = pos - (data.rfind(b"\n", 0, pos) + 1) + 1
    return line, col


MAX_JSON_DEPTH = 256


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether containers nest deeper than ``limit`` (an explicit stack: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _too_deep(data: bytes) -> json.JSONDecodeError:
    message = f"nested deeper than {MAX_JSON_DEPTH} levels"
    return json.JSONDecodeError(message, data.decode("utf-8", "replace"), 0)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def escaped_text(text: str) -> str:
    """``text`` with every lone surrogate (a path's undecodable byte as ``os.fsdecode`` holds it,
    a truncated emoji) written as its ``\\udXXX`` escape: text every UTF-8 encoder takes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in a string or key written as its ``\\udXXX`` escape."""
    if isinstance(value, str):
        return escaped_text(value)
    if isinstance(value, dict):
        return {escape_lone_surrogates(k): escape_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_lone_surrogates(v) for v in value]
    return value


def loads_lenient(data: bytes) -> Any:
    """Parse one JSON document; NaN, Infinity and integers past 64 bits are accepted as Python does.

    A document nested deeper than ``MAX_JSON_DEPTH`` is refused (a JSONDecodeError): every
    reader after this one may walk it recursively.

    A lone surrogate escape (``"\\ud800"``, what a truncated emoji becomes) is kept escaped, as
    the six characters ``\\ud800``: a string holding the surrogate itself could not be encoded
    again by any writer (status, report, every backend).
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise _too_deep(data) from None
        try:
            value = json.loads(data.decode("utf-8"))
        except RecursionError:
            raise _too_deep(data) from None
        except (json.JSONDecodeError, UnicodeDecodeError):  # read_json names the line of each
            raise
        except ValueError as exc:  # an integer past sys.get_int_max_str_digits(): not readable
            raise json.JSONDecodeError(str(exc), data.decode("utf-8", "replace"), 0) from None
        if _SURROGATE_ESCAPE.search(data):
            value = escape_lone_surrogates(value)
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and _depth_exceeds(value, MAX_JSON_DEPTH):
        raise _too_deep(data)
    return value


def open_regular(fpath: Path | str, what: str = "file") -> BinaryIO:
    """``fpath`` opened for reading, or a RunError when it is not a regular file.

    Opened without blocking, so a FIFO or a device named like a run file (a receipt, a cache)
    is refused at once instead of waiting for a writer that never comes.
    """
    fpath = Path(fpath)
    try:
        fd = os.open(fpath, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise RunError(f"{fpath}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RunError(f"{fpath}: not a regular file; refusing to read {what} from it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_bytes(fpath: Path | str, what: str = "file") -> bytes:
    """The bytes of a regular file (see :func:`open_regular`)."""
    with open_regular(fpath, what) as fh:
        return fh.read()


def read_json(fpath: Path | str, what: str = "JSON") -> Any:
    """The parsed content of a JSON file, or a RunError naming the file, line and column."""
    fpath = Path(fpath)
    data = read_regular_bytes(fpath, what)
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
    with open_regular(fpath, what) as fh:
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


def canonical_text(obj: Any) -> str:
    """:func:`canonical_json` as text, before it is encoded (a lone surrogate kept as it is)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def _stdlib_canonical(obj: Any) -> bytes:
    return canonical_text(obj).encode("utf-8")


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
    return record_and_canonical(raw, fpath, lineno, what)[1]


def record_and_canonical(
    raw: bytes, fpath: Path | str, lineno: int, what: str = "JSONL"
) -> tuple[Any, bytes]:
    """One JSONL line's record and its canonical bytes (one parse for both), or a RunError
    naming the file and line."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = parse_jsonl_line(raw, fpath, lineno, what)
        return value, _stdlib_canonical(value)
    try:
        return value, orjson.dumps(value, option=_ORJSON_CANONICAL)
    except orjson.JSONEncodeError:
        return value, _stdlib_canonical(value)


def json_safe(value: Any) -> Any:
    """Replace NaN and infinities by strings so that strict JSON writers accept the value."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


MAX_YAML_VALUES = 200_000


class YamlTooLarge(ValueError):
    """A YAML document whose aliases would expand it past ``MAX_YAML_VALUES`` values."""


def _expanded_values(root: Any) -> int:
    """How many values the node graph holds once every alias is expanded (no recursion).

    Each node's size is computed once (aliases share nodes), so a "billion laughs" document is
    measured in time linear in its text, and refused before anything expands it.
    """
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[id(node)] = 1
            continue
        if children_done:
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            sizes[id(node)] = total
            if total > MAX_YAML_VALUES:
                return total
            continue
        if len(stack) > MAX_YAML_VALUES:
            return len(stack)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes.get(id(root), 0)


def load_yaml_text(text: str) -> Any:
    """Plain YAML content of one document, safely: no tags that build objects, and refused
    (YamlTooLarge) when aliases would expand it past ``MAX_YAML_VALUES`` values."""
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    node = yaml.compose(text, Loader=loader_cls)
    if node is None:
        return None
    values = _expanded_values(node)
    if values > MAX_YAML_VALUES:
        raise YamlTooLarge(
            f"aliases would expand the document past {MAX_YAML_VALUES} values (an alias bomb?); refusing it"
        )
    loader = loader_cls("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(fpath: Path | str, what: str = "YAML") -> Any:
    """Plain YAML content (interpolations stay as written), or a RunError with the line."""
    import yaml

    fpath = Path(fpath)
    try:
        text = read_regular_bytes(fpath, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunError(f"{fpath}: {what} is not valid UTF-8 (byte {exc.start})") from exc
    try:
        return load_yaml_text(text)
    except yaml.YAMLError as exc:
        raise RunError(yaml_error_message(fpath, exc)) from exc
    except (YamlTooLarge, RecursionError) as exc:
        raise RunError(f"{fpath}: invalid YAML: {yaml_refusal(exc)}") from exc


def yaml_refusal(exc: Exception) -> str:
    """Why a YAML document was refused after it parsed."""
    return "nested too deep" if isinstance(exc, RecursionError) else str(exc)


def yaml_error_message(fpath: Path | str, exc: Exception) -> str:
    """``file:line:col: problem`` for a PyYAML error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{fpath}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}"
    return f"{fpath}: invalid YAML: {problem}"


def count_lines(fpath: Any) -> int:
    """Non-blank lines of a text file, counted in constant memory (however long a line is)."""
    count = 0
    tail_has_text = False
    with open(fpath, "rb") as fh:
        while chunk := fh.read(1 << 20):
            pieces = chunk.split(b"\n")
            for piece in pieces[:-1]:
                if tail_has_text or piece.strip():
                    count += 1
                tail_has_text = False
            tail_has_text = tail_has_text or bool(pieces[-1].strip())
    return count + (1 if tail_has_text else 0)


def metric_value(value: Any) -> float | None:
    """A plottable number from ints, floats, bools and numpy scalars; None for anything else."""
    if value is None:  # most fields asked for are absent
        return None
    kind = type(value)
    if kind is float:  # JSON's numbers first: the checks below ask the ABCs (slow, per row)
        return value  # type: ignore[no-any-return]
    if kind is int:
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:  # an integer past the float range (JSON allows any length)
            return None
    item = getattr(value, "item", None)  # numpy scalars, 0-d arrays
    if callable(item):
        try:
            inner = item()
        except (TypeError, ValueError):
            return None
        if isinstance(inner, bool | int | float):
            return float(inner)
    return None


def attributes_json(obj: Any, fields: str) -> dict[str, Any]:
    """An object's attributes as a JSON object, in the order named: ``fields`` is a space-separated
    list of ``name`` (the key is the attribute's name) or ``key=attribute`` (the key differs).
    The one way the result types (coverage, a compared task) turn into their JSON, so each says
    only which attributes it shows, under which keys."""
    out = {}
    for field in fields.split():
        key, _, attribute = field.partition("=")
        out[key] = getattr(obj, attribute or key)
    return out
