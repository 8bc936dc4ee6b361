"""The gateway's settings: one frozen object, built once at start-up.

Every default lives in the field declarations below, nowhere else. Values come, in order of precedence, from
explicit overrides (CLI flags), then `SESSIONGATE_`-prefixed environment variables, then these defaults.
Nothing reads the environment at import time: `GatewaySettings.from_env()` is called by the entry point.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_DATABASE_URL", "GatewaySettings", "SettingsError"]

ENV_PREFIX = "SESSIONGATE_"
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.sessiongate/sessiongate.db"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Base URLs of the SGLang workers, e.g. ("http://127.0.0.1:30001", "http://127.0.0.1:30002").
    workers: tuple[str, ...] = ()
    database_url: str = DEFAULT_DATABASE_URL
    # Run the store's migrations at start-up (the embedded default); replicas sharing PostgreSQL run
    # `sessiongate db upgrade` once instead.
    auto_migrate: bool = True
    # Optional single client key for local deployments; empty means no authentication (said at start-up).
    api_key: str = ""
    # The admin API's key, separate from client keys; empty disables the admin API.
    admin_key: str = ""
    max_body_bytes: int = 4 * 1024 * 1024
    upstream_connect_timeout_s: float = 3.0
    # Longest silence allowed from a worker: before the first byte, or between two streamed chunks.
    upstream_read_timeout_s: float = 300.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    # Consecutive failed health checks before a worker leaves the pool.
    unhealthy_after: int = 2
    log_level: str = "info"
    log_json: bool = True
    # Log message contents (prompts, answers). Off by default: they are user data.
    log_content: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GatewaySettings:
        """Build settings from `SESSIONGATE_*` variables, then apply non-None `overrides`."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.name.upper()
            if name in env:
                values[f.name] = _parse(name, env[name], f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls(**values)
        except TypeError as exc:
            raise SettingsError(str(exc)) from exc
        settings.validate()
        return settings

    def validate(self) -> None:
        for url in self.workers:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"{ENV_PREFIX}WORKERS: {url!r} is not an http(s) URL")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"{ENV_PREFIX}MAX_BODY_BYTES must be at least 1024")
        if self.unhealthy_after < 1:
            raise SettingsError(f"{ENV_PREFIX}UNHEALTHY_AFTER must be at least 1")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(name: str, raw: str, annotation: object) -> object:
    kind = str(annotation)
    try:
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(raw)
            return lowered in _TRUE
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("tuple"):
            return tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a valid {kind}") from exc
    return raw
