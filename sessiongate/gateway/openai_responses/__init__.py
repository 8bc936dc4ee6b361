"""OpenAI's Responses API on the gateway: a response chain is a session, each response one of its turns.

`api.py` holds the handlers, `convert.py` the translation between input/output items and chat messages,
`stream.py` the chat SSE -> Responses event translation, `schemas.py` the request body.
"""

from __future__ import annotations

from .api import create_response, delete_response, get_response, list_input_items
from .schemas import ResponsesBody

__all__ = ["ResponsesBody", "create_response", "delete_response", "get_response", "list_input_items"]
