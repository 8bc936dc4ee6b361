"""sessiongate's Python SDK: sessions with client-side context, chat (streamed or not), typed results.

Depends on httpx only. `SessionGate` is the sync client, `AsyncSessionGate` its async twin:

    from sdk import SessionGate

    with SessionGate(base_url="http://127.0.0.1:8000") as client:
        session = client.sessions.create()
        reply = session.chat([{"role": "user", "content": "hi"}])
        print(reply.content, reply.usage)
"""

from __future__ import annotations

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
from ._session_types import SessionDeleted, SessionInfo, SessionPage, Turn, TurnTimings, TurnToolCall
from ._streaming import AsyncChatStream, ChatStream
from ._types import (
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
    "AsyncChatStream",
    "AsyncSession",
    "AsyncSessionGate",
    "AuthenticationError",
    "BadRequestError",
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
    "Message",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "Session",
    "SessionDeleted",
    "SessionGate",
    "SessionGateError",
    "SessionInfo",
    "SessionPage",
    "ToolCall",
    "ToolCallDelta",
    "Turn",
    "TurnTimings",
    "TurnToolCall",
    "UnprocessableEntityError",
    "Usage",
    "__version__",
]
