"""`JSONBytesResponse`: a JSON response rendered by orjson, for the chat path.

Starlette's `JSONResponse` renders with the standard library's `json.dumps`, several times orjson's CPU on a chat
answer; the answer came from a worker through `orjson.loads`, so orjson can always write it back.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

__all__ = ["JSONBytesResponse"]


class JSONBytesResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
