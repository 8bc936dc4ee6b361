"""An in-process stand-in for an SGLang worker, speaking SGLang's HTTP API (the parts the gateway uses).

For tests and benchmarks about the gateway's own logic: answers are deterministic and instant (or delayed
as configured), usage and the cache report follow SGLang's wire format (`usage.prompt_tokens_details`,
`sglext.cached_tokens_details` when `return_cached_tokens_details` is set, a separate `sglext` chunk and a
usage chunk in streams), and a prefix cache over whitespace tokens makes `cached_tokens` behave like a radix
cache: a prompt that extends an earlier one reports the shared part as cached. Faults are switched on through
`FakeWorkerBehaviour`. Run standalone with `python -m benchmarks.fake_worker --port 31001`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["FakeWorkerBehaviour", "create_fake_worker"]


@dataclass
class FakeWorkerBehaviour:
    """Knobs a test may turn while the app runs."""

    model: str = "fake-model"
    page_size: int = 1
    token_delay_s: float = 0.0
    # Answer every chat request with this status and an OpenAI error body.
    fail_status: int | None = None
    # Stop a stream (connection dropped) after this many content chunks.
    die_after_chunks: int | None = None
    # Never answer chat requests (until the client gives up).
    hang: bool = False
    healthy: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Prompts this worker has seen (its device cache), and prompts any worker sharing `pool` has seen.
    device: list[tuple[str, ...]] = field(default_factory=list)
    pool: list[tuple[str, ...]] = field(default_factory=list)

    def cache_hit(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """Where the longest cached prefix of `tokens` comes from, like SGLang's cache report."""
        on_device = self._longest(self.device, tokens)
        in_pool = max(self._longest(self.pool, tokens) - on_device, 0)
        self.device.append(tokens)
        self.pool.append(tokens)
        return {"device": on_device, "host": 0, "storage": in_pool}

    def _longest(self, seen: list[tuple[str, ...]], tokens: tuple[str, ...]) -> int:
        best = 0
        for earlier in seen:
            n = 0
            for a, b in zip(earlier, tokens, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best - best % self.page_size


def _prompt_tokens(body: dict[str, Any]) -> tuple[str, ...]:
    words: list[str] = []
    for message in body.get("messages") or []:
        words.append(f"<{message.get('role')}>")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        words.extend(str(content or "").split())
        for call in message.get("tool_calls") or []:
            words.extend(str(call.get("function", {}).get("arguments", "")).split())
    return tuple(words)


def _reply_words(body: dict[str, Any]) -> list[str]:
    last: dict[str, Any] = next(
        (m for m in reversed(body.get("messages") or []) if m.get("role") in {"user", "tool"}), {}
    )
    content = last.get("content")
    if not isinstance(content, str):
        content = "..."
    limit = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    return ["echo:", *content.split()][:limit]


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if not tools or choice in (None, "none", "auto"):
        return None
    name = tools[0]["function"]["name"]
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name", name)
    return {
        "id": f"call_{abs(hash(name)) % 10**8:08d}",
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps({"q": "x"}).decode()},
    }


def create_fake_worker(behaviour: FakeWorkerBehaviour | None = None) -> Starlette:
    b = behaviour or FakeWorkerBehaviour()

    async def health(request: Request) -> Response:
        return Response(status_code=200 if b.healthy else 503)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": b.model, "object": "model", "owned_by": "fake"}]})

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        b.requests.append(body)
        if b.hang:
            await asyncio.sleep(3600)
        if b.fail_status is not None:
            return JSONResponse(
                {
                    "object": "error",
                    "message": "injected failure",
                    "type": "BadRequestError",
                    "param": None,
                    "code": b.fail_status,
                },
                status_code=b.fail_status,
            )
        prompt = _prompt_tokens(body)
        hit = b.cache_hit(prompt)
        cached = sum(hit.values())
        words = _reply_words(body)
        call = _tool_call(body)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(words),
            "total_tokens": len(prompt) + len(words),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        details = {**hit, "storage_backend": "file"}
        rid = f"chatcmpl-{len(b.requests)}"
        if not body.get("stream"):
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s * len(words))
            message: dict[str, Any] = {"role": "assistant", "content": None if call else " ".join(words)}
            if call:
                message["tool_calls"] = [call]
            answer: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": b.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                "usage": usage,
            }
            if body.get("return_cached_tokens_details"):
                answer["sglext"] = {"cached_tokens_details": details}
            return JSONResponse(answer)
        return StreamingResponse(_stream(b, body, rid, words, call, usage, details), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


async def _stream(
    b: FakeWorkerBehaviour,
    body: dict[str, Any],
    rid: str,
    words: list[str],
    call: dict[str, Any] | None,
    usage: dict[str, Any],
    details: dict[str, Any],
) -> AsyncIterator[bytes]:
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": b.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    if call:
        head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
        yield event([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}])
        args = call["function"]["arguments"]
        for part in (args[: len(args) // 2], args[len(args) // 2 :]):
            yield event(
                [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": part}}]},
                        "finish_reason": None,
                    }
                ]
            )
    else:
        for i, word in enumerate(words):
            if b.die_after_chunks is not None and i >= b.die_after_chunks:
                raise ConnectionResetError("injected: worker died mid-stream")
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s)
            yield event([{"index": 0, "delta": {"content": (" " if i else "") + word}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}])
    if body.get("return_cached_tokens_details"):
        yield event([], sglext={"cached_tokens_details": details})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield event([], usage=usage)
    yield b"data: [DONE]\n\n"


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="A fast fake SGLang worker for gateway benchmarks.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=31001)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    app = create_fake_worker(FakeWorkerBehaviour(token_delay_s=args.token_delay_s))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
