"""Prefix breaks, seen and counted: a turn whose resent history does not extend its session's stored context.

The store decides "extends or not" by digest as it records the turn (`context_reset`); only on a turn that does not
(and has a context to break: not the session's first) does the gateway read the stored context back and find the
first difference (`sessions.prefix_breaks.find_break`): the turn records it (`prefix_break` in
`GET /v1/sessions/{id}/turns`, and in the chat page's table), the session counts it (the admin API lists sessions
by `min_prefix_breaks`), and `/metrics` counts it by kind (`sessiongate_prefix_breaks_total`). The read is one
query on a turn that is about to prefill most of its prompt again anyway; a store failure here is logged, never
shown to the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.state import GatewayState
from sessiongate.sessions.prefix_breaks import find_break

__all__ = ["note_prefix_break"]

log = structlog.get_logger(__name__)


async def note_prefix_break(
    state: GatewayState,
    tenant_id: str,
    session_id: str,
    turn: sessions.TurnRecord,
    messages: Sequence[Mapping[str, Any]],
) -> None:
    if not turn.context_reset or turn.seq <= 1:
        return
    try:
        context = await state.store.session_context(session_id, tenant_id=tenant_id)
        found = find_break(context, messages)
        if found is None:
            return
        state.metrics.prefix_breaks.labels(found.kind).inc()
        await state.store.record_prefix_break(turn.id, session_id=session_id, detail=found.as_dict())
        log.info("prefix_break", index=found.index, kind=found.kind, tokens_lost=found.tokens_lost)
    except sessions.StoreError as exc:
        log.warning("prefix_break_not_recorded", error=str(exc))
