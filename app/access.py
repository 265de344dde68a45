"""API keys (semantics 13): ``/v1/*`` needs ``Authorization: Bearer <key>`` when keys exist.

Keys never live in the YAML: the config names an environment variable (``api_keys_env``)
and/or a file (``api_keys_file``, one key a line, ``#`` comments), read once at start-up.
A configured source that yields no key is a start-up error naming its setting. Comparison
is constant-time (``hmac.compare_digest`` against every key, no early exit). ``/health``,
``/openapi.json`` and ``/docs`` stay open.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from replicas.errors import Reason, ScoringError
from replicas.settings import HttpSettings, SettingsError

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs"})


def _split(text: str) -> list[str]:
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return [key for line in lines for key in line.replace(",", " ").split()]


def load_api_keys(http: HttpSettings, environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """Every key from the configured sources; empty when none is configured (no auth)."""
    keys: list[str] = []
    if http.api_keys_env:
        found = _split(environ.get(http.api_keys_env, ""))
        if not found:
            name = http.api_keys_env
            raise SettingsError(f"api_keys_env: environment variable {name!r} is unset or empty")
        keys += found
    if http.api_keys_file:
        path = Path(http.api_keys_file)
        if not path.is_file():
            raise SettingsError(f"api_keys_file: {str(path)!r} is not a readable file")
        found = _split(path.read_text())
        if not found:
            raise SettingsError(f"api_keys_file: {str(path)!r} holds no key")
        keys += found
    return frozenset(keys)


def key_matches(presented: str, keys: frozenset[str]) -> bool:
    """Compare with every key in constant time per key (no short-circuit on a match)."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    return matched


def check_access(path: str, authorization: str | None, keys: frozenset[str]) -> None:
    """Raise a 401 envelope unless ``path`` is open, no keys are configured, or the bearer
    token is one of ``keys``."""
    if not keys or path in OPEN_PATHS:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key_matches(token.strip(), keys):
        raise ScoringError(
            Reason.UNAUTHORIZED, "missing or invalid API key (Authorization: Bearer <key>)",
            status_code=401,
        )  # fmt: skip
