"""Secret masking: what a config must never carry to a backend, a log or a receipt.

Two ways a value is known to be secret:

* by its key: a key is secret when one of its name parts (split at ``_``, ``-``, ``.``, spaces
  and camelCase, compared case-insensitively, plurals folded) is a secret word, two adjacent parts
  form a secret pair such as ``api_key``, or the name ends in ``key`` after a part that does not
  make it an ordinary key (``openai_key`` is secret; ``sort_key``, ``key_metrics`` and ``monkey``
  stay visible);
* by its shape, whatever its key: URI credentials (``https://u:PW@h``, ``https://TOKEN@h``),
  secret query and fragment parameters (``sig``, ``X-Amz-Signature``, ``key``, ``code``,
  ``access_token``...), command-line options (``--api-key VALUE``, ``--password=VALUE``,
  ``["--api-key", VALUE]``), header lists (``[{name: x-api-key, value: VALUE}]``), ``NAME=VALUE``
  with a secret name, ``Bearer VALUE`` and well-known token formats (``sk-``, ``hf_``, ``ghp_``,
  ``github_pat_``, ``xox?-``, ``AKIA``, JWTs).

Every value found either way is a known secret: any other occurrence of it is masked too, in the
config, in artifacts, in failure reasons and in every log record (:func:`install_log_redaction`).
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import logging
import re
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MASK = "***"
MIN_SUBSTRING_SECRET = 8
MIN_REDACTED_SECRET = 4

_SECRET_WORDS = frozenset(
    {
        "token", "password", "passwd", "passphrase", "pwd", "secret", "credential",
        "auth", "authorization", "header", "cookie", "apikey", "privatekey", "accesskey",
        "secretkey", "bearer", "sessionid", "hmac",
    }
)  # fmt: skip
_SECRET_PAIRS = frozenset(
    {
        ("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
        ("account", "key"), ("signing", "key"), ("encryption", "key"), ("master", "key"),
        ("ssh", "key"), ("client", "key"), ("session", "key"), ("license", "key"),
        ("connection", "string"), ("conn", "str"), ("session", "id"),
    }
)  # fmt: skip
# A name ending in "key" is a secret (openai_key, Ocp-Apim-Subscription-Key) unless the part
# before it says it is an ordinary lookup key.
_ORDINARY_KEY_QUALIFIERS = frozenset(
    {
        "primary", "foreign", "sort", "cache", "group", "metric", "dict", "partition", "hash",
        "lookup", "join", "unique", "index", "composite", "row", "column", "map", "order",
        "reward", "answer", "label", "dedup", "seed", "random", "rng", "prompt", "input",
        "output", "result", "target", "num", "max", "min", "idempotency", "shard", "routing",
        "s3", "object", "file", "data", "dataset", "field", "config", "sample", "task", "item",
        "record", "id", "name", "value", "default", "prefix", "bucket", "blob", "storage",
        "table", "message", "split", "score", "sorting", "grouping", "stratify", "the", "a",
    }
)  # fmt: skip
# Model vocabulary uses "token" for things that are not secrets: pad_token, max_tokens...
_TOKEN_QUALIFIERS_BEFORE = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "max", "min", "num", "total", "special",
     "stop", "start", "end", "image", "audio", "video", "think", "thinking", "output", "input", "new",
     "completion", "prompt", "reasoning", "cached", "cache", "generated", "generation", "response",
     "context", "vocab", "sampled", "text", "answer", "zero"}
)  # fmt: skip
_TOKEN_QUALIFIERS_AFTER = frozenset(
    {"id", "ids", "count", "counts", "limit", "budget", "length", "len", "size", "type",
     "usage", "per", "level", "classification"}
)  # fmt: skip
# Query and fragment parameters that carry a credential although their name is not secret-like.
_SECRET_PARAMS = frozenset(
    {"sig", "signature", "x-amz-signature", "x-goog-signature", "x-amz-credential",
     "x-goog-credential", "x-amz-security-token", "key", "code", "sas", "pass", "pw"}
)  # fmt: skip
_PLURAL_PARTS = frozenset({"key", "string", "id"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")

# scheme://userinfo@ -- userinfo runs to the LAST "@" of the authority (a password may hold "@").
_URI_USERINFO = re.compile(
    r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/?#'\"<>]*)@(?=[^\s@/?#'\"<>]*(?:[/?#\s'\"<>]|$))"
)
_PARAM = re.compile(r"([?&#;])([A-Za-z0-9_.\-]+)=([^&#\s'\"<>]+)")
_ASSIGN = re.compile(r"(?<![\w.-])(-{0,2}[A-Za-z][\w.-]*)(=|:\s*)(['\"]?)([^\s'\"&=-][^\s'\"&]*)")
_OPTION_THEN_VALUE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(\s+)(['\"]?)([^\s'\"-][^\s'\"]*)")
_TOKEN_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_\-]{16,}"
    r"|hf_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposre]-[A-Za-z0-9\-]{8,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*)"
)
_BEARER = re.compile(r"\b([Bb]earer|Basic)(\s+)([A-Za-z0-9._~+/=\-]{8,})")
_OPTION = re.compile(r"^--?[A-Za-z][\w.-]*$")
_HEADER_NAME_FIELDS = ("name", "key", "header")
_HEADER_VALUE_FIELDS = ("value", "val", "secret")


def key_parts(key: str) -> list[str]:
    """Lower-case name parts of a key: ``wandbApiKey`` and ``WANDB-API.key`` give wandb, api, key."""
    return [p.lower() for p in _SPLIT.split(_CAMEL.sub(" ", str(key))) if p]


def _singular(part: str) -> str:
    """``passwords`` -> ``password``, ``keys`` -> ``key``; other words as they are."""
    if part.endswith("s") and (part[:-1] in _SECRET_WORDS or part[:-1] in _PLURAL_PARTS):
        return part[:-1]
    return part


def is_secret_key(key: Any) -> bool:
    """Whether a value under this key name must be masked."""
    parts = [_singular(p) for p in key_parts(str(key))]
    for i, part in enumerate(parts):
        if part in _SECRET_WORDS:
            if part == "token" and (
                (len(parts) == 1 and str(key).lower().endswith("tokens"))
                or (i > 0 and parts[i - 1] in _TOKEN_QUALIFIERS_BEFORE)
                or (i + 1 < len(parts) and parts[i + 1] in _TOKEN_QUALIFIERS_AFTER)
            ):
                continue
            return True
        if i + 1 < len(parts) and (part, parts[i + 1]) in _SECRET_PAIRS:
            return True
    return len(parts) > 1 and parts[-1] == "key" and parts[-2] not in _ORDINARY_KEY_QUALIFIERS


def _is_secret_param(name: str) -> bool:
    return name.lower() in _SECRET_PARAMS or is_secret_key(name)


def _looks_like_token(text: str) -> bool:
    return len(text) >= 16 or bool(_TOKEN_SHAPES.fullmatch(text))


# User names that stand alone in a URI without being a credential (``ssh://git@host``).
_PLAIN_URI_USERS = frozenset(
    {"git", "hg", "svn", "user", "admin", "root", "ubuntu", "ec2-user", "centos", "anonymous", "guest", "ftp"}
)


def _is_uri_token(user: str) -> bool:
    """A user part with no password (``http://TOKEN@host``) is a token, short or long, unless it is
    a well-known plain user name: a tracking URI's client quotes it in every error it raises."""
    plain = len(user) < MIN_REDACTED_SECRET or user.lower() in _PLAIN_URI_USERS
    return _looks_like_token(user) or not plain


def find_secret_spans(text: str) -> list[tuple[int, int]]:
    """Where the secret parts of a free-text value are, found by their shape (module docstring)."""
    spans: list[tuple[int, int]] = []
    if len(text) < MIN_REDACTED_SECRET:
        return spans
    if "://" in text:
        for m in _URI_USERINFO.finditer(text):
            user, sep, password = m.group(2).partition(":")
            if sep and password:
                spans.append((m.start(2) + len(user) + 1, m.end(2)))
            elif not sep and _is_uri_token(user):
                spans.append(m.span(2))
    if "=" in text:
        spans.extend(m.span(3) for m in _PARAM.finditer(text) if _is_secret_param(m.group(2)))
    if "=" in text or ":" in text:
        spans.extend(m.span(4) for m in _ASSIGN.finditer(text) if is_secret_key(m.group(1).lstrip("-")))
    if "-" in text:
        spans.extend(
            m.span(4) for m in _OPTION_THEN_VALUE.finditer(text) if is_secret_key(m.group(1).lstrip("-"))
        )
    spans.extend(m.span(0) for m in _TOKEN_SHAPES.finditer(text))
    spans.extend(m.span(3) for m in _BEARER.finditer(text))
    return [(a, b) for a, b in spans if b > a and text[a:b] != MASK]


def find_secret_values(text: str) -> set[str]:
    """The secret parts of a free-text value long enough to be looked for elsewhere."""
    return {text[a:b] for a, b in find_secret_spans(text) if b - a >= MIN_REDACTED_SECRET}


def mask_uri_credentials(text: str) -> str:
    """``https://user:pass@host`` -> ``https://user:***@host``; every secret shape masked too."""
    spans = sorted(find_secret_spans(text))
    if not spans:
        return text
    out, pos = [], 0
    for a, b in spans:
        if b <= pos:
            continue
        out.append(text[pos : max(a, pos)])
        out.append(MASK)
        pos = b
    out.append(text[pos:])
    return "".join(out)


def encoded_forms(secret: str) -> frozenset[str]:
    """``secret`` and every form an encoder writes it in: JSON strings (ASCII-escaped or not, so
    ``é`` as ``\\u00e9``, ``"`` as ``\\"``, control characters escaped), HTML text and
    attributes (``&quot;``, ``&#x27;``), and HTML of JSON. Masking a text already encoded must
    find each of them; masking decoded values first (:func:`mask_values`) needs none."""
    return _encoded_forms(secret)


@functools.lru_cache(maxsize=4096)
def _encoded_forms(secret: str) -> frozenset[str]:
    forms = {secret}
    for ensure_ascii in (True, False):
        forms.add(json.dumps(secret, ensure_ascii=ensure_ascii)[1:-1])
    for text in list(forms):
        forms.add(html.escape(text, quote=True))
        forms.add(html.escape(text, quote=False))
        forms.add(html.escape(text, quote=True).replace("&#x27;", "&#39;"))
        forms.add(text.replace("</", "<\\/"))  # an embedded script's JSON
    return frozenset(f for f in forms if len(f) >= MIN_REDACTED_SECRET)


def _replace_all(text: str, secrets: Iterable[str]) -> str:
    forms = {form for secret in secrets for form in _encoded_forms(secret)}
    for secret in sorted(forms, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class ValueMasker:
    """Masks decoded values (strings, and the strings inside dicts and lists) against the given
    and the known secrets, and with ``shapes`` every secret-shaped part: the one way a value is
    masked before any encoder (JSON, HTML, a chart, base64 of gzip) writes it out. Masking the
    encoded text instead would also hit the encoder's own words (a page's ``var data``, a run of
    base64): the encoding is never rewritten."""

    def __init__(self, secrets: Iterable[str] = (), *, shapes: bool = True) -> None:
        wanted = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_REDACTED_SECRET} | _known_secrets
        self.forms = sorted({f for secret in wanted for f in _encoded_forms(secret)}, key=len, reverse=True)
        self.shapes = shapes

    def text(self, text: str) -> str:
        """``text`` with every secret (and, with ``shapes``, every secret-shaped part) masked."""
        if self.shapes:
            text = mask_uri_credentials(text)
        for form in self.forms:
            if form in text:
                text = text.replace(form, MASK)
        return text

    def values(self, node: Any, *, keys: bool = True) -> Any:
        """A copy of a decoded structure with every string masked, and with ``keys`` every
        string key (without, the keys are the structure's own names: a page's data schema)."""
        if isinstance(node, str):
            return self.text(node)
        if isinstance(node, dict):
            return {
                self.text(k) if keys and isinstance(k, str) else k: self.values(v, keys=keys)
                for k, v in node.items()
            }
        if isinstance(node, list | tuple):
            return [self.values(v, keys=keys) for v in node]
        return node


def mask_values(value: Any, secrets: Iterable[str] = (), *, shapes: bool = True) -> Any:
    """A copy of a decoded structure (dicts, lists, strings: a rollout, a metrics mapping, span
    attributes, a request body) with every known secret, and with ``shapes`` every secret-shaped
    part, masked in each string and key, before any encoding writes it out."""
    return ValueMasker(secrets, shapes=shapes).values(value)


def short_secrets(config: Any) -> list[tuple[str, int]]:
    """``(key path, length)`` of each string under a secret key shorter than
    ``MIN_REDACTED_SECRET`` characters (an interpolation as written is not a value yet). Such a
    value is masked where it sits, but never looked for elsewhere: masking every ``a`` of a page
    or a log would destroy it, so anywhere else it shows as it is."""
    found: list[tuple[str, int]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{path}.{k}" if path else str(k)
                if is_secret_key(k) and isinstance(v, str) and 0 < len(v) < MIN_REDACTED_SECRET:
                    found.append((key, len(v)))
                else:
                    walk(v, key)
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(config, "")
    return found


_warned_short: set[tuple[str, str]] = set()


def warn_short_secrets(config: Any, source: str) -> None:
    """Warn (once per source and key) about every secret too short to be masked elsewhere."""
    for key, length in short_secrets(config):
        if (source, key) in _warned_short:
            continue
        _warned_short.add((source, key))
        logging.getLogger(__name__).warning(
            "%s: %s holds a secret of %d character(s): too short to be masked wherever else it "
            "appears (a page, a log, a backend's text), so it is masked only under its own key; "
            "use a secret of %d or more characters",
            source, key, length, MIN_REDACTED_SECRET,
        )  # fmt: skip


def _has_value(value: Any) -> bool:
    return value is not None and value != "" and value != {} and value != []


def _propagated(value: Any) -> Iterable[str]:
    """The strings under a secret key worth masking wherever else they appear: never a number
    (``password: 10`` must not turn every 10 of a metrics file into ``***``), never a string
    too short to be told from ordinary text. Such values are still masked where they sit."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _propagated(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _propagated(v)
    elif isinstance(value, str) and len(value) >= MIN_REDACTED_SECRET:
        yield value


def _header_secret_field(node: dict[Any, Any]) -> str | None:
    """In ``{name: x-api-key, value: V}`` the field holding the secret (``value``), else None."""
    for name_field in _HEADER_NAME_FIELDS:
        name = node.get(name_field)
        if isinstance(name, str) and is_secret_key(name):
            for value_field in _HEADER_VALUE_FIELDS:
                if value_field in node:
                    return value_field
    return None


def _option_values(items: list[Any] | tuple[Any, ...]) -> set[int]:
    """Indexes of list items that follow a secret command-line option (``["--api-key", V]``)."""
    return {
        i + 1
        for i, item in enumerate(items[:-1])
        if isinstance(item, str) and _OPTION.match(item) and is_secret_key(item.lstrip("-"))
    }


def collect_secret_values(config: Any) -> set[str]:
    """Every string stored under a secret key (at any depth) and every secret found by shape."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            header_field = _header_secret_field(value)
            for k, v in value.items():
                if is_secret_key(k) or k == header_field:
                    found.update(_propagated(v))
                else:
                    walk(v)
        elif isinstance(value, list | tuple):
            secret_items = _option_values(value)
            for i, v in enumerate(value):
                if i in secret_items:
                    found.update(_propagated(v))
                else:
                    walk(v)
        elif isinstance(value, str):
            found.update(find_secret_values(value))

    walk(config)
    return found


_secret_names: dict[str, bool] = {}


def _is_secret_name(key: Any) -> bool:
    """:func:`is_secret_key`, remembered per name: metric names repeat on every call."""
    if not isinstance(key, str):
        return False
    known = _secret_names.get(key)
    if known is None:
        known = is_secret_key(key)
        if len(_secret_names) < 100_000:
            _secret_names[key] = known
    return known


def mask_secret_named(metrics: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """Metrics with every value under a secret-like name (``api_key``) masked; cheap when none is.

    Returns ``metrics`` itself when no name is secret-like, else a masked copy.
    """
    for key in metrics:
        if _is_secret_name(key):
            return {k: (MASK if _is_secret_name(k) else v) for k, v in metrics.items()}
    return metrics


def mask_text_metrics(metrics: Mapping[Any, Any], secrets: Iterable[str] = ()) -> Mapping[Any, Any]:
    """Metrics with every text value (and text inside a structured value) masked by value and by
    shape; ``metrics`` itself when it holds no text (numbers cost one type check each)."""
    if not any(isinstance(v, str | dict | list | tuple) for v in metrics.values()):
        return metrics
    structured = str | dict | list | tuple
    return {k: mask_values(v, secrets) if isinstance(v, structured) else v for k, v in metrics.items()}


# Keys whose values are shown even when they come from the environment (``${oc.env:VAR}``).
_SAFE_ENV_KEY_PARTS = frozenset(
    {"name", "model", "project", "experiment", "entity", "dir", "path", "root", "mode", "seed",
     "tag", "tags", "split", "dataset", "version", "device", "region", "group", "enabled"}
)  # fmt: skip
_ENV_INTERPOLATION = re.compile(r"\$\{(?:oc\.env|env):")


def keep_env_interpolations(raw: Any, resolved: Any, key: str = "") -> tuple[Any, set[str]]:
    """``resolved`` with every value written as ``${oc.env:VAR}`` shown as written (unresolved).

    A value that lives only in the environment is a credential more often than not, and the
    config is logged: unless its key is known safe (``model_name``, ``project``...) the
    interpolation is shown as written and its resolved value returned as a secret, so that it
    is masked wherever else it appears.
    """
    secrets: set[str] = set()

    def walk(raw_node: Any, node: Any, key: str) -> Any:
        if isinstance(raw_node, dict) and isinstance(node, dict):
            return {k: walk(raw_node.get(k), v, str(k)) if k in raw_node else v for k, v in node.items()}
        if isinstance(raw_node, list) and isinstance(node, list) and len(raw_node) == len(node):
            return [walk(r, v, key) for r, v in zip(raw_node, node, strict=True)]
        if isinstance(raw_node, str) and raw_node != node and _ENV_INTERPOLATION.search(raw_node):
            if key_parts(key) and key_parts(key)[-1] in _SAFE_ENV_KEY_PARTS and not is_secret_key(key):
                return node
            secrets.update(_propagated(node))
            return raw_node
        return node

    return walk(raw, resolved, key), secrets


# Secrets seen by this process (configs loaded, exporters set up): every log record and warning
# is redacted against them, whichever library writes it.
_known_secrets: set[str] = set()
_known_lock = threading.Lock()


def remember_secrets(secrets: Iterable[str]) -> None:
    """Add values to the process-wide set every log record and warning is redacted against."""
    new = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_REDACTED_SECRET}
    if new - _known_secrets:
        with _known_lock:
            _known_secrets.update(new)


@contextlib.contextmanager
def secrets_scope() -> Iterator[None]:
    """Forget at the block's end the secrets remembered inside it: for a process that runs units
    of work which are separate processes in real use (a test runner's tests), so that one unit's
    secret (a 4-character password) does not mask the next unit's output."""
    with _known_lock:
        before = set(_known_secrets)
    try:
        yield
    finally:
        with _known_lock:
            _known_secrets.intersection_update(before)


def secret_forms_as_bytes(secrets: Iterable[str], *, known: bool = True) -> frozenset[bytes] | None:
    """Every encoded form (``encoded_forms``) of the ``secrets`` of ``MIN_REDACTED_SECRET`` or
    more characters (and, with ``known``, of every known secret) as UTF-8 bytes, to search a file
    for; None when one has no UTF-8 form (a lone surrogate): only a decoded search can find it."""
    wanted = {s for s in secrets if len(s) >= MIN_REDACTED_SECRET} | (_known_secrets if known else set())
    forms = set()
    for secret in wanted:
        for form in _encoded_forms(secret):
            try:
                forms.add(form.encode("utf-8"))
            except UnicodeEncodeError:
                return None
    return frozenset(forms)


def file_holds_any(fpath: Any, forms: frozenset[bytes], block: int = 1 << 20) -> bool:
    """Whether the file's bytes hold one of ``forms``: a scan in C, a block at a time (constant
    memory whatever the file's size), each block searched with the tail of the one before."""
    if not forms:
        return False
    overlap = max(len(f) for f in forms) - 1
    tail = b""
    with open(fpath, "rb") as fh:
        while chunk := fh.read(block):
            window = tail + chunk
            if any(f in window for f in forms):
                return True
            tail = window[-overlap:] if overlap else b""
    return False


def redact_secret_values(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every occurrence of the given and the known secret values (no shapes: for large
    data texts, where a value search costs a scan in C and a shape search a regex per field)."""
    return _replace_all(text, {s for s in secrets if len(s) >= MIN_REDACTED_SECRET} | _known_secrets)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every occurrence of a known secret, and anything secret-shaped, in free text."""
    text = mask_uri_credentials(text)  # shapes first: a known secret may be part of one
    return _replace_all(text, {s for s in secrets if len(s) >= MIN_REDACTED_SECRET} | _known_secrets)


def mask_secrets(config: Any, extra_secrets: Iterable[str] = ()) -> Any:
    """A copy of a plain config container with every secret masked; the input is not changed."""
    secrets = collect_secret_values(config) | {s for s in extra_secrets if s}
    long_secrets = sorted((s for s in secrets if len(s) >= MIN_SUBSTRING_SECRET), key=len, reverse=True)

    def mask_string(value: str) -> str:
        if value in secrets:
            return MASK
        for secret in long_secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return mask_uri_credentials(value)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            header_field = _header_secret_field(value)
            return {
                k: (MASK if (is_secret_key(k) or k == header_field) and _has_value(v) else walk(v))
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            secret_items = _option_values(value)
            return [MASK if i in secret_items else walk(v) for i, v in enumerate(value)]
        if isinstance(value, str):
            return mask_string(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and str(value) in secrets:
            return MASK
        return value

    return walk(config)


# --- one redaction for every log record and warning -------------------------------------------

_installed = False


def _redacting_factory(base: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's business, not ours
            return record
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return record

    return factory


def install_log_redaction() -> None:
    """Redact every log record and warning of this process (idempotent).

    Installed by the CLI and by the API entry points: whichever library logs (ours, MLflow,
    W&B, urllib3), the message and traceback pass :func:`redact_text` before any handler sees them.
    """
    global _installed
    if _installed:
        return
    _installed = True
    logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
    base_format = warnings.formatwarning

    def formatwarning(message: Any, *args: Any, **kwargs: Any) -> str:
        return redact_text(base_format(message, *args, **kwargs))

    warnings.formatwarning = formatwarning  # type: ignore[assignment]
