"""Session KV operations on every routable worker: the context's pages, keyed as the session's own requests keyed
them, retained or dropped everywhere (the admin API's KV endpoints, a session's close, the last response's delete).

A worker that fails or lacks the extension is reported in the answer (`error`), never fails the whole operation.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from sessiongate import sessions
from sessiongate.gateway.errors import UpstreamError
from sessiongate.gateway.state import GatewayState
from sessiongate.sglang_ext.protocol import SessionKVRequest

__all__ = ["kv_everywhere", "kv_request"]


async def kv_everywhere(
    state: GatewayState,
    record: sessions.SessionRecord,
    operation: Literal["retain", "drop"],
    kv: SessionKVRequest | None,
) -> list[dict[str, Any]]:
    """Run a KV operation on every routable worker; one entry per worker, its result or its error."""
    if kv is None:
        return []
    if operation == "drop":
        kv = kv.model_copy(update={"keep_messages": await _inherited_messages(state, record)})
    workers = state.router.candidates()

    async def one(worker_id: str, url: str) -> dict[str, Any]:
        try:
            result = await state.extension.session_kv(worker_id, url, record.id, operation, kv)
        except UpstreamError as exc:
            return {"worker": worker_id, "error": exc.message}
        return {"worker": worker_id, **result.model_dump()}

    results = list(await asyncio.gather(*(one(w.id, w.url) for w in workers)))
    if operation == "drop":
        await state.router.drop_kv(record.id)
    return results


async def kv_request(
    state: GatewayState, record: sessions.SessionRecord, *, priority: int, ttl_ms: int = 300_000
) -> SessionKVRequest | None:
    context = await state.store.session_context(record.id, tenant_id=record.tenant_id)
    if not context:
        return None  # no turn yet: nothing cached anywhere
    # The pages are keyed as the session's own requests were: by the tenant's cache salt (without it no page
    # matches on a real worker) and with the tools the last turn rendered into the prompt.
    return SessionKVRequest(
        messages=context,
        tools=await _last_tools(state, record),
        cache_salt=state.salts.for_tenant(record.tenant_id),
        priority=priority,
        ttl_ms=ttl_ms,
    )


async def _inherited_messages(state: GatewayState, record: sessions.SessionRecord) -> int:
    """A fork's first turn holds its parent's context: those messages' pages are the parent's too, and a drop of the
    fork leaves them (0 for a session that is no fork)."""
    first = await state.store.list_turns(record.id, tenant_id=record.tenant_id, after_seq=0, limit=1)
    if not first or first[0].session_source != "fork":
        return 0
    return len(first[0].input_messages)


async def _last_tools(state: GatewayState, record: sessions.SessionRecord) -> list[dict[str, Any]] | None:
    turns = await state.store.list_turns(
        record.id, tenant_id=record.tenant_id, after_seq=max(record.turn_count - 1, 0), limit=1
    )
    tools = turns[-1].request.get("tools") if turns else None
    return tools if isinstance(tools, list) and tools else None
