"""Retry decisions, shared by the sync and async clients: whether to retry, and how long to wait first.

Pure functions of the response headers, the status and the number of retries already taken; the clients only
sleep and resend. A response is retried on 408, 409, 429 and 5xx, unless the server says otherwise with
`x-should-retry: true|false`. The wait is the server's `retry-after-ms` or `Retry-After` (seconds or an HTTP
date) when that is positive and at most `MAX_RETRY_AFTER` seconds, else a jittered exponential backoff.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping

from ._constants import INITIAL_RETRY_DELAY, MAX_RETRY_AFTER, MAX_RETRY_DELAY, RETRYABLE_STATUS_CODES

__all__ = ["backoff_delay", "parse_retry_after", "retry_delay", "should_retry_status"]


def should_retry_status(status_code: int, headers: Mapping[str, str]) -> bool:
    """Whether a response with this status and these headers is worth sending again."""
    override = headers.get("x-should-retry", "").strip().lower()
    if override == "true":
        return True
    if override == "false":
        return False
    return status_code in RETRYABLE_STATUS_CODES or status_code >= 500


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asks to wait (`retry-after-ms`, then `Retry-After`), or None if it does not say."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return float(millis) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - (time.time() if now is None else now)


def backoff_delay(retries_taken: int, *, jitter: float | None = None) -> float:
    """Exponential backoff before retry `retries_taken` (0-based), jittered by a factor in [0.75, 1]."""
    factor = random.uniform(0.75, 1.0) if jitter is None else jitter
    return min(INITIAL_RETRY_DELAY * 2.0**retries_taken, MAX_RETRY_DELAY) * factor


def retry_delay(retries_taken: int, headers: Mapping[str, str] | None = None) -> float:
    """Seconds to wait before the next attempt: the server's wish when reasonable, else the backoff."""
    asked = parse_retry_after(headers) if headers is not None else None
    if asked is not None and 0 < asked <= MAX_RETRY_AFTER:
        return asked
    return backoff_delay(retries_taken)
