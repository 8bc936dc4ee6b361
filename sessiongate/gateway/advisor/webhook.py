"""Verifying the typing webhook's signature: HMAC-SHA256 over `timestamp + "." + body` with a shared secret.

The sender puts the Unix timestamp in `X-Sessiongate-Timestamp` and `sha256=<hex digest>` in
`X-Sessiongate-Signature`. A request is refused when either header is missing, the signature does not match,
the timestamp is more than `window_s` (300 s) away from the gateway's clock (a replay of an old capture), or the
same signature was already accepted within the window (a replay of a fresh one). The replay cache holds each
accepted signature until its timestamp leaves the window, so it stays bounded by the request rate. It is the
replicas' shared state (`gateway.shared`): with Redis, a replay sent to another replica is refused too; while
Redis is unreachable each replica refuses the replays it has seen itself (`local`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from dataclasses import dataclass, field

from sessiongate.gateway.shared import LocalShared, SharedState, SharedUnavailable

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
    shared: SharedState = field(default_factory=LocalShared)
    # This replica's own record of the signatures it accepted: the answer when `shared` (Redis) does not answer.
    local: LocalShared = field(default_factory=LocalShared)

    def check(self, timestamp: str | None, signature: str | None, body: bytes, now: float) -> float:
        """The signature and the window, without the replay cache: when it was sent, or `WebhookRejected`."""
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
        return sent_at

    async def verify(self, timestamp: str | None, signature: str | None, body: bytes, now: float) -> None:
        """Accept the request (remembering its signature) or raise `WebhookRejected`. `now`: Unix seconds."""
        sent_at = self.check(timestamp, signature, body, now)
        key = f"webhook:{(signature or '').strip()}"
        # Remembered until its timestamp leaves the window: after that the window check refuses it anyway.
        ttl_s = sent_at + self.window_s - now + 1.0
        first = await self.local.set_if_absent(key, ttl_s=ttl_s)
        if self.shared is not self.local and self.shared.distributed:
            with contextlib.suppress(SharedUnavailable):  # unreachable: this replica's own record decides
                first = await self.shared.set_if_absent(key, ttl_s=ttl_s)
        if not first:
            raise WebhookRejected("Webhook replayed.")
