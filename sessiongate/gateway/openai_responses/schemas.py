"""The Responses API request body, validated at the wire edge (pydantic), and the `input_items` query.

Only what the gateway relies on is typed; fields of OpenAI's request the gateway has no use for (`reasoning`,
`include`, `user`, `truncation`, ...) are accepted and echoed where the Response object has them. What the gateway
cannot serve (`background`, `conversation`, hosted tools) is refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ResponsesBody"]


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=64)
    store: bool = True
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    background: bool | None = None
    conversation: Any = None
