"""Implicit sessions: a chat request that names no session is attached to the session whose context it extends.

Clients resend the whole conversation every turn. The store keeps, per session, the digest of its context (a sha256
chain over the normalised messages, `sessions.history`) and its length, so a request whose leading messages have a
stored session's digest *is* that session's next turn, named or not. The candidates are the request's prefixes that
end with an assistant message (a context always does: it ends with the last answer) and leave at least one new
message; one indexed query finds the tenant's active sessions among them, and the longest match wins. Two sessions
with that same context (two conversations that began alike) are ambiguous: the request starts a new session rather
than guess. A first message has no such prefix, so it always starts a new session.

Also here: the session headers other gateways and agents send, so their clients need no change (docs/architecture.md,
"Sessions without client changes", lists their sources).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiongate.sessions import SessionStore
from sessiongate.sessions.history import EMPTY_DIGEST, extend_normalised, normalise_message

__all__ = ["SESSION_HEADERS", "SESSION_SOURCE_KEY", "candidate_contexts", "infer_session"]

# Where clients may name the session, in order of precedence (the body's `session_id` comes after them).
SESSION_HEADERS = (
    "x-session-id",  # sessiongate's own
    "x-session-affinity",  # SGLang's model gateway (smg) session affinity
    "x-smg-routing-key",  # smg's manual routing policy
    "x-dynamo-session-id",  # NVIDIA Dynamo (docs.nvidia.com/dynamo: "Identify Agent Sessions")
    "x-session-token",  # llm-d's session-affinity scorer
    "session-id",  # OpenAI Codex CLI (Dynamo's "Agent Harnesses" page: "Codex sends a session-id header")
    "session_id",  # the same, as some Codex versions and relays spell it
)
# A key of the ASGI scope by which the gateway's own internal requests (a Responses API turn) say how the session
# was named; a client cannot set it.
SESSION_SOURCE_KEY = "sessiongate.session_source"


def candidate_contexts(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(digest, length) of each prefix of `messages` that could be a stored context: it ends with an assistant
    message and leaves at least one message new."""
    contexts = []
    digest = EMPTY_DIGEST
    for index, message in enumerate(messages[:-1]):
        digest = extend_normalised(digest, (normalise_message(message),))
        if message.get("role") == "assistant":
            contexts.append((digest, index + 1))
    return contexts


async def infer_session(store: SessionStore, tenant_id: str, messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The tenant's one active session whose context `messages` extends; None for none or an ambiguous match."""
    contexts = candidate_contexts(messages)
    if not contexts:
        return None
    found = await store.find_extended_sessions(tenant_id=tenant_id, contexts=contexts, limit=2)
    return found[0][0] if len(found) == 1 else None
