"""The advisor: typing and tool signals become advisory prefetches with reservations, each settled as used,
late, wasted, cancelled or missed. `core`, `quality` and `toolkv` are pure (a fake clock drives them in tests);
`service` adds the I/O, with two parts it owns apart: `tool_lifecycle` (the tool-call KV lifecycle's learnt state
and its retain) and `replicas` (the replicas' shared state); `signals` are the HTTP endpoints; `webhook` verifies
signed typing webhooks."""

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
