"""The advisor: typing and tool signals become advisory prefetches with reservations, each settled as used,
late, wasted, cancelled or missed. `core`, `decide`, `quality` and `toolkv` are pure (a fake clock drives them in
tests): `decide` turns one signal and a snapshot of what is known into actions; `executor` performs them (the
book, the store, the prefetches, statistics, logs); `service` is the advisor the gateway holds, with the parts it
owns: `tool_lifecycle` (the tool-call KV lifecycle's learnt state and its retain), `replicas` (the replicas'
shared state, or no-ops with one process) and `prefetch` (one advisory's prefetch); `webhook` verifies signed
typing webhooks. The HTTP endpoints that deliver the signals are `gateway/api/signals.py`: nothing here imports
the HTTP layer."""

from __future__ import annotations

from .core import AdvisorBook, Claim, LiveAdvisory, settle
from .quality import HintQuality
from .service import Advisor
from .stats import AdvisoryStats
from .webhook import WebhookRejected, WebhookVerifier, sign

__all__ = [
    "Advisor",
    "AdvisorBook",
    "AdvisoryStats",
    "Claim",
    "HintQuality",
    "LiveAdvisory",
    "WebhookRejected",
    "WebhookVerifier",
    "settle",
    "sign",
]
