"""The advisor's bookkeeping, the adaptive rule and webhook verification, driven by a fake clock (no I/O)."""

from __future__ import annotations

import pytest

from sessiongate.gateway.advisor import (
    AdvisorBook,
    AdvisoryStats,
    HintQuality,
    LiveAdvisory,
    WebhookRejected,
    WebhookVerifier,
    sign,
)
from sessiongate.gateway.advisor import settle as settle_claim
from sessiongate.gateway.advisor.core import prefetch_residency
from sessiongate.gateway.shared import LocalShared


def _advisory(now: float = 0.0, *, fire_in: float = 0.0, ttl: float = 10.0, worker: str = "a") -> LiveAdvisory:
    return LiveAdvisory(
        id="adv_1",
        session_id="s",
        tenant_id="t",
        kind="typing",
        worker_id=worker,
        target="device",
        created_at=now,
        fire_at=now + fire_in,
        expires_at=now + fire_in + ttl,
    )


def test_fired_and_ready_advisory_is_used_when_the_turn_hits_the_kv() -> None:
    book = AdvisorBook()
    book.add(advisory := _advisory())
    assert book.due(0.0) == [advisory]
    assert book.reservation("s", 1.0) is not None
    advisory.ready_at = 2.0
    claim = book.claim("s", "a", 5.0)
    assert claim is not None
    assert claim.provisional == "used"
    assert claim.lead_s == 3.0
    assert settle_claim(claim, {"device": 120, "host": 0}) == "used"
    assert settle_claim(claim, {"device": 0, "storage": 120}) == "wasted"  # it went there, found nothing there
    # The device had no free room for the prefetched pages: they stayed in the worker's host tier, and were found.
    assert settle_claim(claim, {"device": 0, "host": 120, "storage": 0}) == "used"
    assert book.get("s", 5.0) is None  # claimed: gone


def test_request_before_ready_is_late_and_elsewhere_is_wasted() -> None:
    book = AdvisorBook()
    book.add(_advisory())
    book.due(0.0)
    claim = book.claim("s", "a", 1.0)
    assert claim is not None
    assert settle_claim(claim, {"device": 99}) == "late"
    book.add(_advisory())
    book.due(0.0)
    elsewhere = book.claim("s", "b", 1.0)
    assert elsewhere is not None
    assert elsewhere.provisional == "wasted"


def test_no_live_advisory_is_no_claim_and_expiry_settles() -> None:
    book = AdvisorBook()
    assert book.claim("s", "a", 0.0) is None
    book.add(_advisory(ttl=2.0))
    assert book.expire(1.0) == []
    assert book.claim("s", "a", 3.0) is None  # expired: left for expire()
    (gone,) = book.expire(3.0)
    assert gone.stopped is False


def test_debounce_refreshes_and_fires_a_waiting_advisory_now() -> None:
    book = AdvisorBook(ttl_s=10.0)
    book.add(_advisory(fire_in=5.0))
    assert book.due(1.0) == []
    assert book.reservation("s", 1.0) is None  # not fired yet: nothing to honour
    refreshed = book.refresh("s", 2.0)
    assert refreshed is not None
    assert refreshed.fire_at == 2.0
    assert refreshed.expires_at == 15.0
    assert book.due(2.0) == [refreshed]
    assert book.refresh("other", 2.0) is None


def test_stop_shortens_to_the_grace_and_ends_cancelled() -> None:
    book = AdvisorBook(ttl_s=30.0, stop_grace_s=2.0)
    book.add(_advisory(ttl=30.0))
    stopped = book.stop("s", 1.0)
    assert stopped is not None
    assert stopped.expires_at == 3.0
    (gone,) = book.expire(3.0)
    assert gone.stopped is True
    assert book.stop("s", 4.0) is None


def test_mostly_wasted_hints_get_host_tier_then_none_then_recover() -> None:
    quality = HintQuality(window_s=100.0, min_samples=4)
    assert quality.tier("s", "t", "typing", 0.0) == "device"
    for outcome in ("wasted", "wasted", "used", "late"):
        quality.record("s", "t", "typing", outcome, 1.0)
    assert quality.tier("s", "t", "typing", 2.0) == "host"  # 2 of 4 wasted
    for _ in range(12):
        quality.record("s", "t", "typing", "wasted", 3.0)
    assert quality.tier("s", "t", "typing", 4.0) == "none"
    # Another session of the same tenant is taxed through the tenant and kind keys too.
    assert quality.tier("s2", "t", "typing", 4.0) == "none"
    assert quality.tier("s2", "t2", "tool_result", 4.0) == "device"
    # Cancelled and missed are not judgements of a hint.
    quality.record("s3", "t3", "explicit", "cancelled", 4.0)
    assert quality.waste_ratio(("session", "s3"), 4.0) is None
    # Once the window has passed, the key is tried again.
    assert quality.tier("s", "t", "typing", 200.0) == "device"


def test_late_is_wasted_for_the_tool_lifecycles_hints_and_good_for_typing() -> None:
    quality = HintQuality(window_s=100.0, min_samples=4)
    for _ in range(4):
        quality.record("s", "t", "typing", "late", 1.0)
        quality.record("s2", "t2", "tool_call", "late", 1.0)
        quality.record("s3", "t3", "tool_result", "late", 1.0)
    assert quality.waste_ratio(("kind", "typing"), 2.0) == 0.0
    assert quality.tier("s", "t", "typing", 2.0) == "device"
    assert quality.waste_ratio(("kind", "tool_call"), 2.0) == 1.0
    assert quality.tier("s2", "t2", "tool_call", 2.0) == "none"
    assert quality.waste_ratio(("kind", "tool_result"), 2.0) == 1.0
    for _ in range(4):
        quality.record("s4", "t4", "tool_call", "used", 3.0)
    assert quality.waste_ratio(("session", "s4"), 3.0) == 0.0
    assert HintQuality.is_wasted("tool_call", "wasted")
    assert not HintQuality.is_wasted("tool_call", "cancelled")


def test_a_keep_then_offload_retain_lapses_into_a_scheduled_prefetch() -> None:
    book = AdvisorBook()
    advisory = _advisory(ttl=30.0)
    advisory.action, advisory.retain_s, advisory.then_fire_at = "retain", 2.0, 9.0
    book.add(advisory)
    assert book.due(0.0) == [advisory]  # the retain, at once
    assert book.lapse(1.0) == []  # its answer has not come
    advisory.ready_at = 0.1
    assert book.lapse(1.9) == []  # still held
    assert book.reservation("s", 1.9) is None  # the KV is resident there: the router's score sees it, no bias
    assert book.lapse(2.0) == [advisory]
    assert (advisory.action, advisory.fired, advisory.ready_at, advisory.fire_at) == ("prefetch", False, None, 9.0)
    assert book.reservation("s", 2.0) is None  # unprotected: the router is free until the prefetch fires
    assert book.lapse(3.0) == []  # once
    late = book.claim("s", "a", 5.0)  # back between the retain and the prefetch: nothing was done for it
    assert late is not None
    assert late.provisional == "late"
    book.add(advisory)
    assert book.due(9.0) == [advisory]


def test_stats_precision_recall_lead_time() -> None:
    stats = AdvisoryStats()
    stats.claimed, stats.missed = 3, 1
    stats.settled("typing", "used", lead_s=2.0, bytes_loaded=100)
    stats.settled("typing", "late")
    stats.settled("typing", "wasted", bytes_loaded=500)
    report = stats.report()
    typing = report["kinds"]["typing"]
    assert typing["precision"] == pytest.approx(1 / 3)
    assert typing["recall"] == pytest.approx(2 / 4)
    assert typing["mean_lead_time_s"] == 2.0
    assert typing["wasted_bytes"] == 500
    assert report["recall"] == pytest.approx(0.5)


@pytest.mark.anyio
async def test_webhook_signature_window_and_replay() -> None:
    clock = [1100.0]
    local = LocalShared(clock=lambda: clock[0])
    verifier = WebhookVerifier("secret", window_s=300, local=local)
    body = b'{"session_id":"s","state":"started"}'
    good = sign("secret", "1000", body)
    await verifier.verify("1000", good, body, now=1100)
    with pytest.raises(WebhookRejected, match="replayed"):
        await verifier.verify("1000", good, body, now=1101)
    with pytest.raises(WebhookRejected, match="signature"):
        await verifier.verify("1000", sign("other", "1000", body), body, now=1100)
    with pytest.raises(WebhookRejected, match="signature"):
        await verifier.verify("1001", good, body, now=1100)  # the timestamp is signed too
    with pytest.raises(WebhookRejected, match="window"):
        await verifier.verify("500", sign("secret", "500", body), body, now=1100)
    with pytest.raises(WebhookRejected, match="Missing"):
        await verifier.verify(None, good, body, now=1100)
    # A signature is remembered until its timestamp leaves the window, then forgotten.
    assert not await local.set_if_absent(f"webhook:{good}", ttl_s=1)
    clock[0] = 1302.0
    assert await local.set_if_absent(f"webhook:{good}", ttl_s=1)


def test_withdrawn_advisory_is_gone_and_leaves_no_reservation() -> None:
    book = AdvisorBook()
    book.add(advisory := _advisory())
    book.due(0.0)
    assert book.withdraw("s") is advisory
    assert book.reservation("s", 1.0) is None
    assert book.claim("s", "a", 1.0) is None
    assert book.expire(100.0) == []  # settled by whoever withdrew it, never again at expiry
    assert book.withdraw("s") is None


def test_prefetch_residency_says_where_the_pages_really_are() -> None:
    on_device = prefetch_residency(tokens=1000, target="device", on_device=15, in_host=0, unavailable=1)
    assert on_device == (938, "device")  # the tail page was nowhere
    # The device had no free room: the pages stayed in host memory, and the belief must not say "device".
    assert prefetch_residency(tokens=1000, target="device", on_device=0, in_host=16, unavailable=0) == (1000, "host")
    assert prefetch_residency(tokens=1000, target="device", on_device=8, in_host=8, unavailable=0)[1] == "host"
    assert prefetch_residency(tokens=1000, target="host", on_device=0, in_host=16, unavailable=0) == (1000, "host")
    assert prefetch_residency(tokens=0, target="device", on_device=0, in_host=0, unavailable=0) == (0, "device")
