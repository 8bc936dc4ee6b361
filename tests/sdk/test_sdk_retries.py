"""Retries as a user sees them: which failures are retried, how long the client waits, what it resends."""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from sessiongate import sdk
from sessiongate.sdk import SessionGate
from sessiongate.sdk._retries import backoff_delay, parse_retry_after, retry_delay

if TYPE_CHECKING:
    from .conftest import FakeGateway

HI = [{"role": "user", "content": "hi"}]


def test_503_then_200_succeeds_with_two_calls(client: SessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    session = client.sessions.create()
    gateway.script(gateway.error_response(503, "overloaded", type_="server_error"))
    reply = session.chat(HI)

    assert reply.content == gateway.default_reply
    calls = gateway.calls()
    assert len(calls) == 2
    assert calls[0].headers["idempotency-key"] == calls[1].headers["idempotency-key"]
    assert calls[0].content == calls[1].content
    assert len(sleeps) == 1
    assert 0.375 <= sleeps[0] <= 0.5
    assert session.messages == [*HI, {"role": "assistant", "content": gateway.default_reply}]


def test_429_retry_after_seconds_is_honoured(client: SessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    gateway.script(gateway.error_response(429, "slow down", **{"retry-after": "2"}))
    client.sessions.list()
    assert sleeps == [2.0]
    assert len(gateway.requests) == 2


def test_a_shed_turns_503_retry_after_is_honoured_and_the_turn_sent_again(
    client: SessionGate, gateway: FakeGateway, sleeps: list[float]
) -> None:
    # The gateway's admission sheds a turn with 503 gateway_saturated (or 429 fair_share_exceeded) and Retry-After.
    session = client.sessions.create()
    gateway.script(
        gateway.error_response(503, "saturated", type_="service_unavailable", **{"retry-after": "3"}),
        gateway.error_response(429, "over your share", type_="rate_limit_error", **{"retry-after": "1"}),
    )
    reply = session.chat(HI)
    assert reply.content == gateway.default_reply
    assert sleeps == [3.0, 1.0]
    calls = gateway.calls()
    assert len(calls) == 3
    assert len({call.headers["idempotency-key"] for call in calls}) == 1  # the same turn each time


def test_retry_after_ms_wins_and_long_retry_after_is_capped(
    client: SessionGate, gateway: FakeGateway, sleeps: list[float]
) -> None:
    gateway.script(
        gateway.error_response(429, "a", **{"retry-after-ms": "250", "retry-after": "9"}),
        gateway.error_response(429, "b", **{"retry-after": "3600"}),
    )
    client.sessions.list()
    assert sleeps[0] == 0.25
    assert 0.75 <= sleeps[1] <= 1.0  # an hour is ignored: the backoff for the second retry is used


def test_backoff_grows_exponentially_with_jitter_and_caps_at_8s(gateway: FakeGateway, sleeps: list[float]) -> None:
    gateway.script(*[gateway.error_response(500, "boom") for _ in range(6)])
    client = SessionGate(base_url=gateway.base_url, transport=gateway.transport(), max_retries=6, sleep=sleeps.append)
    with client:
        client.sessions.list()
    caps = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert len(sleeps) == 6
    for slept, cap in zip(sleeps, caps, strict=True):
        assert 0.75 * cap <= slept <= cap


def test_400_is_not_retried(client: SessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    gateway.script(gateway.error_response(400, "bad"))
    with pytest.raises(sdk.BadRequestError):
        client.chat.completions.create(messages=HI)
    assert len(gateway.requests) == 1
    assert sleeps == []


def test_x_should_retry_header_overrides_the_status(
    client: SessionGate, gateway: FakeGateway, sleeps: list[float]
) -> None:
    gateway.script(gateway.error_response(400, "try again", **{"x-should-retry": "true"}))
    client.sessions.list()
    assert len(gateway.requests) == 2

    gateway.script(gateway.error_response(503, "do not", **{"x-should-retry": "false"}))
    with pytest.raises(sdk.InternalServerError):
        client.sessions.list()
    assert len(gateway.requests) == 3


def test_connection_errors_are_retried_then_raised(
    client: SessionGate, gateway: FakeGateway, sleeps: list[float]
) -> None:
    gateway.script(httpx.ConnectError("refused"))
    assert client.sessions.list().data == []
    assert len(sleeps) == 1

    gateway.script(*[httpx.ConnectError("refused") for _ in range(3)])
    with pytest.raises(sdk.APIConnectionError) as info:
        client.sessions.list()
    assert not isinstance(info.value, sdk.APITimeoutError)
    assert len(gateway.requests) == 2 + 3
    assert len(sleeps) == 1 + 2


def test_timeouts_raise_api_timeout_error(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    gateway.script(*[httpx.ReadTimeout("slow") for _ in range(3)])
    with pytest.raises(sdk.APITimeoutError) as info:
        session.chat(HI)
    assert isinstance(info.value, sdk.APIConnectionError)
    assert session.messages == []
    keys = {r.headers["idempotency-key"] for r in gateway.calls()}
    assert len(keys) == 1


def test_max_retries_zero_disables_retries(gateway: FakeGateway, sleeps: list[float]) -> None:
    gateway.script(gateway.error_response(503, "down"))
    client = SessionGate(base_url=gateway.base_url, transport=gateway.transport(), max_retries=0, sleep=sleeps.append)
    with client, pytest.raises(sdk.InternalServerError):
        client.sessions.list()
    assert (len(gateway.requests), sleeps) == (1, [])


def test_retry_after_http_date_and_helpers() -> None:
    now = time.time()
    in_five = email.utils.formatdate(now + 5, usegmt=True)
    waited = parse_retry_after(httpx.Headers({"Retry-After": in_five}), now=now)
    assert waited is not None
    assert 4.0 <= waited <= 5.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None
    assert retry_delay(0, httpx.Headers({"Retry-After": "0"})) <= 0.5  # zero is not a wish: backoff
    assert backoff_delay(3, jitter=1.0) == 4.0
    assert backoff_delay(10, jitter=0.75) == 6.0
