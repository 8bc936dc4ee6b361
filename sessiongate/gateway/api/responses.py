"""`JSONBytesResponse`: a JSON response rendered by orjson, for the chat path.

Starlette's `JSONResponse` renders with the standard library's `json.dumps`, several times orjson's CPU on a chat
answer; the answer came from a worker through `orjson.loads`, so orjson can always write it back. Its headers are
built straight as the raw list the server writes (Starlette's `Response.__init__` builds them through a mutable
header mapping), since a chat turn's few headers are known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["JSONBytesResponse"]

_JSON = (b"content-type", b"application/json")


class JSONBytesResponse(Response):
    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> None:
        self.body = orjson.dumps(content)
        self.status_code = status_code
        self.background = None
        self.raw_headers = [
            (b"content-length", str(len(self.body)).encode()),
            _JSON,
            *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()),
        ]
