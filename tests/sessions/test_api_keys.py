"""API keys in the store, on SQLite and PostgreSQL: only hashes, tenants created on first use, revocation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessions import ApiKeyNotFound, SqlSessionStore

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
