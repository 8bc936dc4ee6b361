"""What the plug-in reads from and adds to SGLang's server (pinned with `patches`, in the process that calls it).

`server_facts` (the published server arguments, the pool by its configured name), `add_http_get_route` (an endpoint
on the HTTP server's FastAPI app), `register_json_required_tool_parser` (a tool-call parser for the tiny test
models, see there).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiongate.sglang_ext.internals.patches import (
    FUNCTION_CALL_PARSER_MODULE,
    HTTP_SERVER_MODULE,
    QWEN25_DETECTOR_MODULE,
    _attribute,
    require_supported_version,
)

__all__ = ["ServerFacts", "add_http_get_route", "register_json_required_tool_parser", "server_facts"]


@dataclass(frozen=True)
class ServerFacts:
    """Facts about the running server, read from SGLang's published server arguments."""

    model_path: str
    served_model_name: str
    page_size: int
    hierarchical_cache: bool
    storage_backend: str | None


def server_facts() -> ServerFacts:
    from sglang.srt.runtime_context import get_server_args

    args = get_server_args()
    return ServerFacts(
        model_path=str(args.model_path),
        served_model_name=str(args.served_model_name or args.model_path),
        page_size=int(args.page_size or 1),
        hierarchical_cache=bool(args.enable_hierarchical_cache),
        storage_backend=_pool_name(
            args.hicache_storage_backend, getattr(args, "hicache_storage_backend_extra_config", None)
        ),
    )


def _pool_name(backend: str | None, extra_config: str | None) -> str | None:
    """The pool's name as the worker was configured with it: for one loaded through SGLang's `dynamic` backend
    (every pool `sglang_ext.launcher` names) the name in its extra config, else SGLang's backend name."""
    if backend != "dynamic" or not extra_config:
        return backend
    try:
        name = json.loads(extra_config).get("backend_name")
    except (ValueError, AttributeError):
        return backend
    return str(name) if name else backend


def add_http_get_route(path: str, endpoint: Callable[[], Any]) -> None:
    """Add `GET path` to the HTTP server's FastAPI app (in the process that serves HTTP)."""
    import importlib

    http_server = importlib.import_module(HTTP_SERVER_MODULE)
    app = _attribute(http_server, "app")
    app.add_api_route(path, endpoint, methods=["GET"])


def register_json_required_tool_parser(name: str) -> None:
    """Register tool-call parser `name`: Qwen2.5's format, but forced calls as a JSON array.

    Like `qwen25` it reads `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` from the
    text when `tool_choice="auto"` (the tiny models' chat template writes that format). Unlike
    it, it declines XGrammar structural tags, so `tool_choice="required"` or a named function
    takes SGLang's other route: a JSON-schema constraint on a JSON array of calls, which honours
    `--constrained-json-disable-any-whitespace`. A structural tag's JSON allows unbounded
    whitespace, and a random-weight model fills `max_tokens` with it instead of ending the call.
    Idempotent; call it in every process (the detokenizer looks the parser up by name too).
    """
    import importlib

    require_supported_version()
    registry = _attribute(importlib.import_module(FUNCTION_CALL_PARSER_MODULE), "FunctionCallParser.ToolCallParserEnum")
    if name in registry:
        return
    qwen25 = _attribute(importlib.import_module(QWEN25_DETECTOR_MODULE), "Qwen25Detector")

    class JsonRequiredQwen25Detector(qwen25):  # type: ignore[misc, valid-type]
        """Qwen2.5 tool calls; forced calls constrained by JSON schema instead of a structural tag."""

        def supports_structural_tag(self) -> bool:
            return False

        def get_structural_tag(self, *args: Any, **kwargs: Any) -> None:
            return None

    registry[name] = JsonRequiredQwen25Detector
