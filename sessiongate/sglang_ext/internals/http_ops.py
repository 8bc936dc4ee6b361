"""The extension's half that runs in SGLang's HTTP server process.

- `add_route`: an endpoint on the server's FastAPI app (`entrypoints.http_server.app`);
- `SchedulerChannel`: awaitable calls into the scheduler (`ipc.SessiongateCall`), sent through the
  tokenizer manager's own socket; replies are matched to callers by `rid` through a handler added
  to the tokenizer manager's result dispatcher, so concurrent calls and a caller that gives up
  (timeout) are both safe: a late reply finds no future and is dropped;
- `load_snapshot`: the scheduler's published `LoadSnapshot` (shared memory, no round trip);
- `render_chat`: the token ids the OpenAI chat endpoint would make of `messages` + `tools`, with the
  server's own `OpenAIServingChat._process_messages` (chat template, tool rendering, tokenizer),
  so a prefetch's keys equal those of the real request's prefix.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiongate.sglang_ext.internals.ipc import SessiongateCall, SessiongateReply

__all__ = [
    "HTTP_SERVER_MODULE",
    "LoadFigures",
    "ModelFacts",
    "RenderError",
    "SchedulerChannel",
    "add_route",
    "load_snapshot",
    "model_facts",
    "render_chat",
]

HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"


class RenderError(ValueError):
    """The messages or tools could not be rendered into a prompt (the client's mistake)."""


def _http_server() -> Any:
    return importlib.import_module(HTTP_SERVER_MODULE)


def _tokenizer_manager() -> Any:
    state = _http_server()._global_state
    if state is None:
        raise RuntimeError("SGLang's HTTP server has no global state yet")
    return state.tokenizer_manager


def add_route(path: str, endpoint: Callable[..., Any], methods: list[str]) -> None:
    _http_server().app.add_api_route(path, endpoint, methods=methods)


@dataclass(frozen=True)
class ModelFacts:
    served_model_name: str
    context_length: int
    vocab_size: int
    page_size: int


def model_facts() -> ModelFacts:
    manager = _tokenizer_manager()
    return ModelFacts(
        served_model_name=str(manager.served_model_name),
        context_length=int(manager.context_len),
        vocab_size=int(manager.model_config.vocab_size),
        page_size=int(manager.server_args.page_size),
    )


@dataclass(frozen=True)
class LoadFigures:
    """What the scheduler's published load snapshot says (rank 0)."""

    running_requests: int
    queued_requests: int
    device_kv_tokens_total: int
    device_kv_tokens_used: int
    queued_prefill_tokens: int


def load_snapshot() -> LoadFigures | None:
    snapshots = _tokenizer_manager().load_snapshot_reader.read_all()
    if not snapshots:
        return None
    snapshot = snapshots[0]
    return LoadFigures(
        running_requests=int(snapshot.num_running_reqs),
        queued_requests=int(snapshot.num_waiting_reqs),
        device_kv_tokens_total=int(snapshot.max_total_num_tokens),
        device_kv_tokens_used=int(snapshot.num_used_tokens),
        queued_prefill_tokens=int(snapshot.num_waiting_uncached_tokens),
    )


def render_chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    manager = _tokenizer_manager()
    serving = _http_server().app.state.openai_serving_chat
    try:
        request = ChatCompletionRequest(model=str(manager.served_model_name), messages=messages, tools=tools)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors(include_url=False)
        )
        raise RenderError(f"invalid messages or tools: {problems}") from error
    try:
        processed = serving._process_messages(request, is_multimodal=False)
    except (ValueError, TypeError, KeyError) as error:  # the template rejected the conversation
        raise RenderError(f"the chat template could not render the messages: {error}") from error
    prompt_ids = processed.prompt_ids
    if isinstance(prompt_ids, str):
        return [int(token) for token in manager.tokenizer.encode(prompt_ids)]
    return [int(token) for token in prompt_ids]


class CallFailed(Exception):
    """The scheduler refused a call: `code` (`not_found`, `conflict`, ...) and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SchedulerChannel:
    """Calls into the scheduler's extension; one per HTTP process, used from its event loop."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[SessiongateReply]] = {}
        self._attached_to: Any = None

    def _attach(self) -> Any:
        manager = _tokenizer_manager()
        if self._attached_to is not manager:
            from sglang.utils import TypeBasedDispatcher

            manager._result_dispatcher += TypeBasedDispatcher([(SessiongateReply, self._on_reply)])
            self._attached_to = manager
        manager.auto_create_handle_loop()
        return manager

    def _on_reply(self, reply: SessiongateReply) -> None:
        future = self._waiting.pop(str(reply.rid), None)
        if future is not None and not future.done():
            future.set_result(reply)

    async def call(
        self, op: str, body: dict[str, Any], wait_s: float = 30.0, *, tokens: bytes = b"", hashes: str = ""
    ) -> dict[str, Any]:
        """`tokens` and `hashes`: a context in its compact forms (`call_payload`), beside the JSON `body`."""
        manager = self._attach()
        rid = f"sessiongate-call-{uuid.uuid4().hex}"
        future: asyncio.Future[SessiongateReply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            manager._dispatch_to_scheduler(
                SessiongateCall(rid=rid, op=op, body=json.dumps(body), tokens=tokens, hashes=hashes)
            )
            reply = await asyncio.wait_for(future, wait_s)
        finally:
            self._waiting.pop(rid, None)
        payload: dict[str, Any] = json.loads(reply.body)
        if not reply.ok:
            raise CallFailed(str(payload.get("code")), str(payload.get("message")))
        return payload
