"""The Python floor: the least a Python gateway on sessiongate's stack can spend per proxied chat turn.

A bare ASGI app on the same server as `sessiongate serve` (uvicorn, uvloop, httptools, no access log) that sends
each `POST /v1/chat/completions` to a worker picked by its `x-session-id` and relays the answer, streamed or not,
through the gateway's own HTTP/1.1 client (`gateway.workers.http1`). It parses the request's JSON and writes it
back with the fields the gateway adds, as the gateway must, and does nothing else: no store, no routing state, no
advisories, no limits, no metrics, no validation beyond "a JSON object". `benchmarks.router_overhead` runs it in
the same phases as sessiongate and the Rust gateways, so the table shows which part of sessiongate's cost per turn
is the product (recording every turn, routing on load and KV, advisories) and which the language and server.

Not a product: errors are minimal (502 when the worker fails) and nothing is recorded.

    python -m sessiongate.benchmarks.floor_proxy --port 31100 --worker http://127.0.0.1:31001 --worker ...
"""

from __future__ import annotations

import argparse
import zlib
from typing import Any

import orjson

from sessiongate.gateway.server_protocol import run_server
from sessiongate.gateway.workers.http1 import Http1Pool, ProtocolError

__all__ = ["FloorProxy"]

_PATH = b"/v1/chat/completions"


class FloorProxy:
    """The ASGI app: one route, everything else 404."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self.pool = Http1Pool(connect_timeout_s=5.0, read_timeout_s=60.0)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await self.pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] != "/v1/chat/completions" or scope["method"] != "POST":
            await _answer(send, 404, b'{"error":"not found"}')
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = orjson.loads(b"".join(chunks))
        session = next((v for k, v in scope["headers"] if k == b"x-session-id"), b"")
        worker = self.workers[zlib.crc32(session) % len(self.workers)]
        # What the gateway adds to every turn (its tenant's salt, the session's priority, the cache report).
        body["cache_salt"] = "floor"
        body["priority"] = 0
        body["return_cached_tokens_details"] = True
        upstream = orjson.dumps(body)
        try:
            if body.get("stream"):
                await self._relay(send, worker, upstream)
            else:
                status, content = await self.pool.post_json(worker, "/v1/chat/completions", upstream)
                await _answer(send, status, content)
        except (TimeoutError, OSError, ProtocolError):
            await _answer(send, 502, b'{"error":"worker failed"}')

    async def _relay(self, send: Any, worker: str, upstream: bytes) -> None:
        async with self.pool.stream_json(worker, "/v1/chat/completions", upstream) as (status, stream):
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            while chunk := await stream.read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer(send: Any, status: int, content: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker", action="append", required=True)
    args = parser.parse_args(argv)
    run_server(FloorProxy(args.worker), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
