"""sessiongate's Python SDK: sessions with client-side context, chat (streamed or not), the signals that drive
advisory prefetch, the admin API, typed results.

Depends on httpx only. `SessionGate` is the sync client, `AsyncSessionGate` its async twin:

    from sessiongate.sdk import SessionGate

    with SessionGate(base_url="http://127.0.0.1:8000") as client:
        session = client.sessions.create()
        session.typing("started")                      # the user is typing: prefetch the session's KV
        reply = session.chat([{"role": "user", "content": "hi"}])
        print(reply.content, reply.usage)
        for turn in session.turns():                   # where each turn ran, what came from cache, the hint's fate
            print(turn.worker, turn.cached_tokens_by_tier, turn.advisory and turn.advisory.outcome)
"""

from __future__ import annotations

from ._admin import Admin, AdminSessions, AdminWorkers, AsyncAdmin, AsyncAdminSessions, AsyncAdminWorkers
from ._admin_types import (
    AdminSession,
    AdminSessionDeleted,
    Advisory,
    AdvisoryKindStats,
    AdvisoryStats,
    KVOperation,
    WorkerInfo,
    WorkerKV,
)
from ._client import AsyncSessionGate, SessionGate
from ._constants import SDK_VERSION as __version__
from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    SessionGateError,
    UnprocessableEntityError,
)
from ._session import AsyncSession, Session
from ._session_types import (
    SessionClosed,
    SessionDeleted,
    SessionInfo,
    SessionPage,
    SignalResult,
    ToolResultReceipt,
    Turn,
    TurnAdvisory,
    TurnTimings,
    TurnToolCall,
)
from ._streaming import AsyncChatStream, ChatStream
from ._types import (
    CachedTokens,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    Function,
    FunctionDelta,
    Message,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "Admin",
    "AdminSession",
    "AdminSessionDeleted",
    "AdminSessions",
    "AdminWorkers",
    "Advisory",
    "AdvisoryKindStats",
    "AdvisoryStats",
    "AsyncAdmin",
    "AsyncAdminSessions",
    "AsyncAdminWorkers",
    "AsyncChatStream",
    "AsyncSession",
    "AsyncSessionGate",
    "AuthenticationError",
    "BadRequestError",
    "CachedTokens",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatStream",
    "Choice",
    "ChunkChoice",
    "ConflictError",
    "Delta",
    "Function",
    "FunctionDelta",
    "InternalServerError",
    "KVOperation",
    "Message",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "Session",
    "SessionClosed",
    "SessionDeleted",
    "SessionGate",
    "SessionGateError",
    "SessionInfo",
    "SessionPage",
    "SignalResult",
    "ToolCall",
    "ToolCallDelta",
    "ToolResultReceipt",
    "Turn",
    "TurnAdvisory",
    "TurnTimings",
    "TurnToolCall",
    "UnprocessableEntityError",
    "Usage",
    "WorkerInfo",
    "WorkerKV",
    "__version__",
]
