"""Bounds on what one chat request may ask for, beyond what the wire schema itself checks.

The limits are settings (`max_messages`, `max_output_tokens`), so they cannot live in the pydantic models;
each refusal is a 400 in the OpenAI error format naming the field, raised before anything is recorded or sent.
"""

from __future__ import annotations

from sessiongate.gateway.api.schemas import ChatRequest
from sessiongate.gateway.errors import InvalidRequest
from sessiongate.gateway.settings import GatewaySettings

__all__ = ["check_chat_bounds"]


def check_chat_bounds(chat: ChatRequest, settings: GatewaySettings) -> None:
    if chat.message_count > settings.max_messages:
        raise InvalidRequest(
            f"Too many messages: {chat.message_count} (the limit is {settings.max_messages}).",
            param="messages",
            code="too_many_messages",
        )
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(chat, field)
        if value is not None and value > settings.max_output_tokens:
            raise InvalidRequest(
                f"'{field}' is {value}; the limit is {settings.max_output_tokens}.",
                param=field,
                code="max_tokens_too_large",
            )
