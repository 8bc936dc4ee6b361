"""Turning a worker's answer into what the store records: the assistant message, usage and cache report.

SGLang puts the cache report (`cached_tokens_details`: device / host / storage) in an `sglext` object at the
response level when the request asks for it with `return_cached_tokens_details`; in a stream it arrives in a
chunk of its own with empty `choices`. The gateway always asks for it, moves it under
`usage.prompt_tokens_details.cached_tokens_details` for the client, and records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["StreamAssembler", "TurnResult", "as_dict", "result_from_response"]


def as_dict(value: object) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one: worker JSON is checked, never trusted."""
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class TurnResult:
    message: dict[str, Any]
    finish_reason: str | None
    model: str | None
    usage: dict[str, Any] | None
    cached_tokens_details: dict[str, Any] | None


def cache_details(chunk: dict[str, Any]) -> dict[str, Any] | None:
    sglext = chunk.get("sglext")
    if isinstance(sglext, dict) and isinstance(sglext.get("cached_tokens_details"), dict):
        return dict(sglext["cached_tokens_details"])
    return None


def attach_cache_details(usage: dict[str, Any], details: dict[str, Any] | None) -> None:
    """Put the cache report where OpenAI clients look for cached tokens."""
    if details is None:
        return
    prompt_details = usage.get("prompt_tokens_details")
    if not isinstance(prompt_details, dict):
        prompt_details = {"cached_tokens": 0}
        usage["prompt_tokens_details"] = prompt_details
    prompt_details["cached_tokens_details"] = details


# About four bytes of English (JSON-encoded messages) per token: the estimate errs towards charging more, since
# the encoding's quotes and keys count too.
_BYTES_PER_TOKEN = 4


def estimate_prompt_tokens(request: dict[str, Any]) -> int:
    """The prompt tokens of a chat request, estimated without a tokenizer (for turns cut short before the worker
    reported its usage)."""
    return len(orjson.dumps([request.get("messages"), request.get("tools")])) // _BYTES_PER_TOKEN


def result_from_response(answer: dict[str, Any]) -> TurnResult:
    choices = answer.get("choices") or [{}]
    first = as_dict(choices[0])
    message = as_dict(first.get("message")) or {"role": "assistant"}
    usage = as_dict(answer.get("usage")) or None
    return TurnResult(
        message=_clean_message(message),
        finish_reason=first.get("finish_reason"),
        model=answer.get("model"),
        usage=usage,
        cached_tokens_details=cache_details(answer),
    )


def _clean_message(message: dict[str, Any]) -> dict[str, Any]:
    kept = {"role": message.get("role") or "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    if message.get("reasoning_content"):
        kept["reasoning_content"] = message["reasoning_content"]
    return kept


@dataclass(slots=True)
class _ToolCallParts:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamAssembler:
    """Accumulates streamed chunks (the parsed `data:` objects) into the final turn."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    cached_tokens_details: dict[str, Any] | None = None
    chunks: int = 0
    # Chunks that carried generated text or tool-call arguments: SGLang streams about one token per such chunk,
    # so this counts the completion tokens of a stream that never reached its usage chunk.
    generated_chunks: int = 0

    def add(self, chunk: dict[str, Any]) -> None:
        # Called for every chunk of every stream (about one per token), so the usual chunk, one choice whose delta
        # is text, takes the fewest steps; what it skips is what the general steps would make of it.
        self.chunks += 1
        model = chunk.get("model")
        if model:
            self.model = model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if "sglext" in chunk:
            self.cached_tokens_details = cache_details(chunk) or self.cached_tokens_details
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if type(content) is str and delta.get("reasoning_content") is None and not delta.get("tool_calls"):
                self.content.append(content)
                if content:
                    self.generated_chunks += 1
            else:
                self._add_delta(delta)

    def _add_delta(self, delta: dict[str, Any]) -> None:
        generated = False
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
            generated = generated or bool(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            self.reasoning.append(delta["reasoning_content"])
            generated = generated or bool(delta["reasoning_content"])
        self.generated_chunks += generated or bool(delta.get("tool_calls"))
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            parts = self.tool_calls.setdefault(int(call.get("index", 0)), _ToolCallParts())
            parts.id = call.get("id") or parts.id
            parts.type = call.get("type") or parts.type
            function = as_dict(call.get("function"))
            parts.name += function.get("name") or ""
            if isinstance(function.get("arguments"), str):
                parts.arguments.append(function["arguments"])

    def tokens_used(self, request: dict[str, Any]) -> int:
        """Tokens the worker spent on a stream cut short: its usage if that chunk came, else the prompt's tokens
        (estimated from `request` unless reported) plus one per generated chunk."""
        usage = self.usage or {}
        total, prompt = usage.get("total_tokens"), usage.get("prompt_tokens")
        if isinstance(total, int):
            return total
        if not isinstance(prompt, int):
            prompt = estimate_prompt_tokens(request)
        return prompt + self.generated_chunks

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": p.id, "type": p.type, "function": {"name": p.name, "arguments": "".join(p.arguments)}}
                for _, p in sorted(self.tool_calls.items())
            ]
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return message

    def result(self) -> TurnResult:
        return TurnResult(self.message(), self.finish_reason, self.model, self.usage, self.cached_tokens_details)
