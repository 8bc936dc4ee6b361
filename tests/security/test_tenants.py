"""Tenants and keys: keys made and revoked through the admin API and the CLI, stored hashed, every session
endpoint scoped to the caller's tenant, open access only when configured for local use."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from sessiongate.cli import main as cli
from sessiongate.sessions import SqlSessionStore, create_engine

from .conftest import SecureGateway, admin, bearer

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hello there"}


async def test_requests_without_a_key_are_refused_unless_configured_open(
    gateway: SecureGateway, make_gateway: Callable[..., Any]
) -> None:
    for method, path in [("GET", "/v1/sessions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")]:
        answer = await gateway.client.request(method, path, json={"messages": [USER]})
        assert answer.status_code == 401, path
        assert answer.json()["error"]["type"] == "authentication_error"
    wrong = await gateway.client.get("/v1/sessions", headers=bearer("sg-not-a-real-key"))
    assert wrong.status_code == 401
    malformed = await gateway.client.get("/v1/sessions", headers={"authorization": "Basic abc"})
    assert malformed.status_code == 401
    assert gateway.worker.requests == []  # nothing reached a worker


async def test_open_mode_serves_the_default_tenant(tmp_path: Path, make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(allow_unauthenticated=True) as gw:
        answer = await gw.client.post(
            "/v1/chat/completions", headers={"x-session-id": "open-1"}, json={"messages": [USER]}
        )
        assert answer.status_code == 200
        assert (await gw.client.get("/v1/sessions/open-1")).json()["tenant_id"] == "default"
        # A tenant key still names its tenant, even on an open gateway.
        key = await gw.new_key("acme")
        assert (await gw.client.get("/v1/sessions/open-1", headers=bearer(key))).status_code == 404


async def test_admin_api_creates_lists_and_revokes_keys(gateway: SecureGateway) -> None:
    created = await gateway.client.post("/v1/admin/keys", json={"tenant": "acme", "name": "ci"}, headers=admin())
    assert created.status_code == 201
    body = created.json()
    secret = body["key"]
    assert secret.startswith("sg-")
    assert len(secret) >= 40
    assert secret.startswith(body["prefix"])
    assert len(body["prefix"]) < 16
    assert (body["tenant_id"], body["name"], body["revoked_at"]) == ("acme", "ci", None)

    listed = (await gateway.client.get("/v1/admin/keys?tenant=acme", headers=admin())).json()["data"]
    assert [k["id"] for k in listed] == [body["id"]]
    assert "key" not in listed[0]  # the secret is shown once, at creation

    ok = await gateway.client.post(
        "/v1/chat/completions", headers={**bearer(secret), "x-session-id": "a-1"}, json={"messages": [USER]}
    )
    assert ok.status_code == 200
    assert (await gateway.client.get("/v1/sessions/a-1", headers=bearer(secret))).json()["tenant_id"] == "acme"

    revoked = await gateway.client.delete(f"/v1/admin/keys/{body['id']}", headers=admin())
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert (await gateway.client.get("/v1/sessions", headers=bearer(secret))).status_code == 401
    again = await gateway.client.delete(f"/v1/admin/keys/{body['id']}", headers=admin())
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    missing = await gateway.client.delete("/v1/admin/keys/key_000000000000000000000000", headers=admin())
    assert missing.status_code == 404


async def test_admin_api_needs_the_admin_key(gateway: SecureGateway, make_gateway: Callable[..., Any]) -> None:
    key = await gateway.new_key("acme")
    assert (await gateway.client.get("/v1/admin/keys")).status_code == 401
    assert (await gateway.client.get("/v1/admin/keys", headers=bearer(key))).status_code == 401
    bad = await gateway.client.post("/v1/admin/keys", json={"tenant": "no spaces"}, headers=admin())
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tenant"
    async with make_gateway(admin_key="", allow_unauthenticated=True) as open_gw:
        refused = await open_gw.client.get("/v1/admin/keys")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_disabled"


async def test_keys_are_stored_hashed(gateway: SecureGateway, tmp_path: Path) -> None:
    key = await gateway.new_key("acme")
    rows = sqlite3.connect(tmp_path / "gateway.db").execute("SELECT prefix, secret_hash FROM api_keys").fetchall()
    assert rows == [(key[:10], hashlib.sha256(key.encode()).hexdigest())]
    assert key not in (tmp_path / "gateway.db").read_bytes().decode("latin-1")


async def test_every_session_endpoint_is_scoped_to_the_tenant(gateway: SecureGateway) -> None:
    acme, globex = bearer(await gateway.new_key("acme")), bearer(await gateway.new_key("globex"))
    first = await gateway.client.post(
        "/v1/chat/completions", headers={**acme, "x-session-id": "shared-id"}, json={"messages": [USER]}
    )
    assert first.status_code == 200
    own = await gateway.client.get("/v1/sessions/shared-id", headers=acme)
    assert own.status_code == 200

    not_found = {"GET /v1/sessions/shared-id", "PATCH /v1/sessions/shared-id", "DELETE /v1/sessions/shared-id"}
    not_found |= {"GET /v1/sessions/shared-id/turns", "GET /v1/sessions/shared-id/messages"}
    for call in sorted(not_found):
        method, path = call.split()
        answer = await gateway.client.request(method, path, headers=globex, json={"priority": 1})
        assert answer.status_code == 404, call
        assert answer.json()["error"]["code"] == "session_not_found"
    assert (await gateway.client.get("/v1/sessions", headers=globex)).json()["data"] == []

    # Chat into another tenant's session: the same 404 as for an unknown id (no leak of its existence),
    # no turn written, nothing sent to a worker.
    sent = len(gateway.worker.requests)
    stolen = await gateway.client.post(
        "/v1/chat/completions", headers={**globex, "x-session-id": "shared-id"}, json={"messages": [USER]}
    )
    assert stolen.status_code == 404
    assert stolen.json()["error"] == {
        "message": "session 'shared-id' not found",
        "type": "not_found_error",
        "param": None,
        "code": "session_not_found",
    }
    assert len(gateway.worker.requests) == sent
    turns = (await gateway.client.get("/v1/sessions/shared-id/turns", headers=acme)).json()["data"]
    assert len(turns) == 1


def test_cli_creates_lists_and_revokes_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    assert cli(["keys", "create", "--tenant", "acme", "--name", "laptop", "--database-url", url]) == 0
    out = capsys.readouterr().out
    key_id = out.split()[1]
    secret = out.split("key: ")[1].strip()
    assert key_id.startswith("key_")
    assert secret.startswith("sg-")

    assert cli(["keys", "list", "--database-url", url]) == 0
    listing = capsys.readouterr().out
    assert key_id in listing
    assert "acme" in listing
    assert "live" in listing
    assert secret not in listing

    assert cli(["keys", "revoke", key_id, "--database-url", url]) == 0
    capsys.readouterr()
    assert cli(["keys", "list", "--tenant", "acme", "--database-url", url]) == 0
    assert "revoked" in capsys.readouterr().out
    assert cli(["keys", "revoke", "key_000000000000000000000000", "--database-url", url]) == 1
    assert cli(["keys", "create", "--tenant", "bad tenant", "--database-url", url]) == 2


def test_cli_sets_and_shows_tenant_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    assert cli(["keys", "limits", "--tenant", "acme", "--database-url", url]) == 0
    assert "no such tenant" in capsys.readouterr().out
    assert cli(["keys", "limits", "--tenant", "acme", "--max-concurrent", "4", "--database-url", url]) == 0
    assert "max_concurrent 4, tokens_per_minute global" in capsys.readouterr().out
    # A flag left out keeps its value; 0 is "no limit", "global" clears the override.
    assert cli(["keys", "limits", "--tenant", "acme", "--tokens-per-minute", "0", "--database-url", url]) == 0
    assert "max_concurrent 4, tokens_per_minute unlimited" in capsys.readouterr().out
    assert cli(["keys", "limits", "--tenant", "acme", "--max-concurrent", "global", "--database-url", url]) == 0
    assert "max_concurrent global, tokens_per_minute unlimited" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli(["keys", "limits", "--tenant", "acme", "--max-concurrent", "-3", "--database-url", url])


async def test_limits_set_by_the_cli_are_stored(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    assert (
        await anyio.to_thread.run_sync(
            cli, ["keys", "limits", "--tenant", "acme", "--tokens-per-minute", "120", "--database-url", url]
        )
        == 0
    )
    store = SqlSessionStore(create_engine(url))
    try:
        [tenant] = await store.list_tenants(tenant_id="acme")
    finally:
        await store.close()
    assert (tenant.max_concurrent, tenant.tokens_per_minute) == (None, 120)
