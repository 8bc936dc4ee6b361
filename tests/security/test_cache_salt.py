"""Every request carries its tenant's cache salt to the worker: derived with an HMAC, not guessable from the
tenant id, stable across replicas sharing the secret, never chosen by the client."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import pytest

from sessiongate.gateway.api.tenancy import CacheSalts

from .conftest import bearer

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hello"}


async def test_requests_carry_the_tenant_salt(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(cache_salt_secret="s3cret-salt") as gw:
        acme, globex = bearer(await gw.new_key("acme")), bearer(await gw.new_key("globex"))
        for headers in (acme, acme, globex):
            assert (
                await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
            ).status_code == 200
        # A client that names a salt (say, another tenant's) gets its own anyway.
        forged = {"messages": [USER], "cache_salt": gw.worker.requests[2]["cache_salt"]}
        assert (await gw.client.post("/v1/chat/completions", headers=acme, json=forged)).status_code == 200
        salts = [r["cache_salt"] for r in gw.worker.requests]
    expected = "tenant-" + hmac.new(b"s3cret-salt", b"acme", hashlib.sha256).hexdigest()[:32]
    assert salts[0] == salts[1] == salts[3] == expected
    assert salts[2] != salts[0]
    assert "acme" not in expected


def test_salts_depend_on_the_secret() -> None:
    a, b = CacheSalts(b"one"), CacheSalts(b"two")
    assert a.for_tenant("acme") == CacheSalts(b"one").for_tenant("acme")  # replicas sharing the secret agree
    assert a.for_tenant("acme") != b.for_tenant("acme")
    assert a.for_tenant("acme") != a.for_tenant("globex")
