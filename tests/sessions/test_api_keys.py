"""API keys in the store, on SQLite and PostgreSQL: only hashes, tenants created on first use, revocation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessiongate.sessions import ApiKeyNotFound, SqlSessionStore

pytestmark = pytest.mark.anyio

T0 = datetime(2025, 1, 1, 12, tzinfo=UTC)


async def test_create_find_list_revoke(store: SqlSessionStore) -> None:
    made = await store.create_api_key(
        tenant_id="acme", name="ci", prefix="sg-abcdefg", secret_hash="a" * 64, created_at=T0
    )
    other = await store.create_api_key(
        tenant_id="globex", name="", prefix="sg-zzzzzzz", secret_hash="b" * 64, created_at=T0
    )
    assert made.id.startswith("key_")
    assert made.tenant_id == "acme"
    assert made.revoked_at is None
    assert await store.find_api_key("a" * 64) == made
    assert await store.find_api_key("c" * 64) is None
    assert [k.id for k in await store.list_api_keys(tenant_id="acme")] == [made.id]
    assert {k.id for k in await store.list_api_keys()} == {made.id, other.id}

    revoked = await store.revoke_api_key(made.id, revoked_at=T0)
    assert revoked.revoked_at == T0
    assert await store.find_api_key("a" * 64) is None
    again = await store.revoke_api_key(made.id, revoked_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert again.revoked_at == T0  # the first revocation stands
    with pytest.raises(ApiKeyNotFound):
        await store.revoke_api_key("key_000000000000000000000000", revoked_at=T0)

    # The key's tenant exists: its sessions can be created like any other's.
    session = await store.create_session(tenant_id="acme", session_id="acme-1")
    assert session.tenant_id == "acme"


async def test_tenant_limit_overrides(store: SqlSessionStore) -> None:
    assert await store.list_tenants(tenant_id="acme") == []
    made = await store.set_tenant_limits("acme", max_concurrent=3, tokens_per_minute=None)
    assert (made.id, made.max_concurrent, made.tokens_per_minute) == ("acme", 3, None)
    # Replaced as a whole; 0 ("no limit") is kept apart from None ("the global value").
    changed = await store.set_tenant_limits("acme", max_concurrent=None, tokens_per_minute=0)
    assert (changed.max_concurrent, changed.tokens_per_minute) == (None, 0)
    assert changed.created_at == made.created_at
    assert await store.list_tenants(tenant_id="acme") == [changed]
    # A tenant made by its first key or session has no overrides.
    await store.create_api_key(tenant_id="globex", name="", prefix="sg-x", secret_hash="d" * 64, created_at=T0)
    by_id = {t.id: t for t in await store.list_tenants()}
    assert {"acme", "globex", "default"} <= set(by_id)
    assert (by_id["globex"].max_concurrent, by_id["globex"].tokens_per_minute) == (None, None)
    assert [t.id for t in await store.list_tenants(with_overrides=True)] == ["acme"]
    # The tenant's keys are untouched by its limits.
    assert [k.tenant_id for k in await store.list_api_keys(tenant_id="globex")] == ["globex"]
