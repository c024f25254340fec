"""Optional API keys: when an operator configures them, every request but the health probes must
carry `Authorization: Bearer <key>`. Keys come from an environment variable or a file, never from
the config itself, so they stay out of serve configs and logs."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from tandem.config import HttpConfig
from tandem.errors import ConfigError, Unauthorized


def load_api_keys(http: HttpConfig) -> frozenset[str]:
    """The configured keys; empty when keys are off. Configured but empty is an operator error."""
    raw: list[str] = []
    if http.api_keys_env:
        raw += os.environ.get(http.api_keys_env, "").split(",")
    if http.api_keys_file:
        raw += Path(http.api_keys_file).read_text().split()
    keys = frozenset(k.strip() for k in raw if k.strip())
    if (http.api_keys_env or http.api_keys_file) and not keys:
        raise ConfigError("API keys are enabled (http.api_keys_env / api_keys_file) but none were found")
    return keys


def check_authorization(header: str | None, keys: frozenset[str]) -> None:
    if not keys:
        return
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    # Compare against every key in constant time, so timing reveals neither a key nor a prefix.
    matched = any(hmac.compare_digest(token.encode(), k.encode()) for k in keys)
    if scheme.lower() != "bearer" or not matched:
        raise Unauthorized("missing or invalid API key; send 'Authorization: Bearer <key>'")
