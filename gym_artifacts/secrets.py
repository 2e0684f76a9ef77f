"""Secret masking: what a config must never carry to a backend, a log or a receipt.

A key is secret when one of its name parts (split at ``_``, ``-``, ``.``, spaces and camelCase,
compared case-insensitively) is a secret word, or two adjacent parts form a secret pair such as
``api_key``; ``key_metrics`` and ``monkey`` stay visible. Credentials inside URIs are masked,
and so is any value equal to a secret found elsewhere in the same config.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"
MIN_SUBSTRING_SECRET = 8

_SECRET_WORDS = frozenset(
    {
        "token", "password", "passwd", "passphrase", "pwd", "secret", "secrets", "credential",
        "credentials", "auth", "authorization", "headers", "header", "cookie", "cookies",
        "apikey", "privatekey", "accesskey", "secretkey", "bearer", "sessionid", "hmac",
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
# Model vocabulary uses "token" for things that are not secrets: pad_token, max_tokens...
_TOKEN_QUALIFIERS_BEFORE = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "max", "min", "num", "total", "special",
     "stop", "start", "end", "image", "audio", "video", "think", "output", "input", "new"}
)  # fmt: skip
_TOKEN_QUALIFIERS_AFTER = frozenset(
    {"id", "ids", "count", "counts", "limit", "budget", "length", "len", "size", "type",
     "usage", "per", "level", "classification"}
)  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_URI = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s/@:]*):([^\s/@]*)@")


def key_parts(key: str) -> list[str]:
    """Lower-case name parts of a key: ``wandbApiKey`` and ``WANDB-API.key`` give wandb, api, key."""
    return [p.lower() for p in _SPLIT.split(_CAMEL.sub(" ", str(key))) if p]


def is_secret_key(key: Any) -> bool:
    """Whether a value under this key name must be masked."""
    parts = key_parts(str(key))
    for i, part in enumerate(parts):
        if part in _SECRET_WORDS:
            if part == "token" and (
                (i > 0 and parts[i - 1] in _TOKEN_QUALIFIERS_BEFORE)
                or (i + 1 < len(parts) and parts[i + 1] in _TOKEN_QUALIFIERS_AFTER)
            ):
                continue
            return True
        if i + 1 < len(parts) and (part, parts[i + 1]) in _SECRET_PAIRS:
            return True
    return False


def mask_uri_credentials(text: str) -> str:
    """``https://user:pass@host`` -> ``https://user:***@host``; secret query values masked too."""
    text = _URI.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    if "?" in text and "://" in text:
        try:
            parts = urlsplit(text)
        except ValueError:
            return text
        if parts.query:
            pairs = parse_qsl(parts.query, keep_blank_values=True)
            if any(is_secret_key(k) for k, _ in pairs):
                query = "&".join(f"{k}={MASK if is_secret_key(k) else v}" for k, v in pairs)
                text = urlunsplit(parts._replace(query=query))
    return text


def _has_value(value: Any) -> bool:
    return value is not None and value != "" and value != {} and value != []


def collect_secret_values(config: Any) -> set[str]:
    """Every string stored under a secret key (at any depth), and URI passwords."""
    found: set[str] = set()

    def leaf_strings(value: Any) -> Iterable[str]:
        if isinstance(value, dict):
            for v in value.values():
                yield from leaf_strings(v)
        elif isinstance(value, list | tuple):
            for v in value:
                yield from leaf_strings(v)
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            yield str(value)

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if is_secret_key(k):
                    found.update(s for s in leaf_strings(v) if s)
                else:
                    walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            for m in _URI.finditer(value):
                if m.group(3):
                    found.add(m.group(3))

    walk(config)
    return found


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of a known secret (and URI credentials) in free text."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
    return mask_uri_credentials(text)


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
            return {k: (MASK if is_secret_key(k) and _has_value(v) else walk(v)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return mask_string(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and str(value) in secrets:
            return MASK
        return value

    return walk(config)
