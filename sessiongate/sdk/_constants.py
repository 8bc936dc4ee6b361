"""Defaults and names the SDK reads in one place: environment variables, timeouts, retry policy, headers.

Each default is written here once; the clients resolve their settings as keyword argument > environment
variable > the default below, when they are constructed (never at import time).
"""

from __future__ import annotations

__all__ = [
    "ADMIN_KEY_ENV",
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "INITIAL_RETRY_DELAY",
    "MAX_RETRY_AFTER",
    "MAX_RETRY_DELAY",
    "RETRYABLE_STATUS_CODES",
    "SDK_VERSION",
    "USER_AGENT",
]

SDK_VERSION = "0.1.0"
USER_AGENT = f"sessiongate-python/{SDK_VERSION}"

BASE_URL_ENV = "SESSIONGATE_BASE_URL"
API_KEY_ENV = "SESSIONGATE_API_KEY"
ADMIN_KEY_ENV = "SESSIONGATE_ADMIN_KEY"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2

# Backoff before retry n (0-based) is min(INITIAL_RETRY_DELAY * 2**n, MAX_RETRY_DELAY) seconds, times
# a jitter drawn from [0.75, 1.0]. A server's Retry-After is honoured when it is at most MAX_RETRY_AFTER s.
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER = 60.0
RETRYABLE_STATUS_CODES = frozenset({408, 409, 429})  # and every status >= 500
