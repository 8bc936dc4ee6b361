"""Verifying the typing webhook's signature: HMAC-SHA256 over `timestamp + "." + body` with a shared secret.

The sender puts the Unix timestamp in `X-Sessiongate-Timestamp` and `sha256=<hex digest>` in
`X-Sessiongate-Signature`. A request is refused when either header is missing, the signature does not match,
the timestamp is more than `window_s` (300 s) away from the gateway's clock (a replay of an old capture), or the
same signature was already accepted within the window (a replay of a fresh one). The replay cache holds each
accepted signature until its timestamp leaves the window, so it stays bounded by the request rate. It lives in
one replica's memory: a replay sent to another replica within the window passes, which the timestamp limits.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookRejected", "WebhookVerifier", "sign"]

TIMESTAMP_HEADER = "x-sessiongate-timestamp"
SIGNATURE_HEADER = "x-sessiongate-signature"


class WebhookRejected(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The header value a sender must put in `X-Sessiongate-Signature`."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(slots=True)
class WebhookVerifier:
    secret: str
    window_s: float = 300.0
    _seen: dict[str, float] = field(default_factory=dict)

    def verify(self, timestamp: str | None, signature: str | None, body: bytes, now: float) -> None:
        """Accept the request (remembering its signature) or raise `WebhookRejected`. `now`: Unix seconds."""
        if not timestamp or not signature:
            raise WebhookRejected("Missing X-Sessiongate-Timestamp or X-Sessiongate-Signature.")
        try:
            sent_at = float(timestamp)
        except ValueError:
            raise WebhookRejected("X-Sessiongate-Timestamp must be Unix seconds.") from None
        if not hmac.compare_digest(sign(self.secret, timestamp, body), signature.strip()):
            raise WebhookRejected("Invalid webhook signature.")
        if abs(now - sent_at) > self.window_s:
            raise WebhookRejected("Webhook timestamp outside the accepted window.")
        self._forget_before(now - self.window_s)
        if signature in self._seen:
            raise WebhookRejected("Webhook replayed.")
        self._seen[signature] = sent_at

    def _forget_before(self, cutoff: float) -> None:
        for old in [s for s, at in self._seen.items() if at < cutoff]:
            del self._seen[old]
