"""The Python floor: the least a Python gateway on sessiongate's stack can spend per proxied chat turn.

A bare ASGI app on the same server as `sessiongate serve` (uvicorn, uvloop, httptools, no access log) that sends
each `POST /v1/chat/completions` to a worker picked by its `x-session-id` and relays the answer, streamed or not,
through the gateway's own HTTP/1.1 client (`gateway.workers.http1`). It parses the request's JSON and writes it
back with the fields the gateway adds, as the gateway must, and does nothing else: no store, no routing state, no
advisories, no limits, no metrics, no validation beyond "a JSON object". `benchmarks.router_overhead` runs it in
the same phases as sessiongate and the Rust gateways, so the table shows which part of sessiongate's cost per turn
is the product (recording every turn, routing on load and KV, advisories) and which the language and server.

With `--database-url` it is the *stored* floor: the same proxy, which also records every turn through the
gateway's own store (`sessions.SqlSessionStore`: the turn committed as pending before the worker sees it, its answer
after, the store's group commit and memory as the gateway has them) and parses what it must for that (the answer's
message and usage; a stream's chunks). It shows what persisting a turn costs with nothing else of the gateway
around it. With `--least-store FILE` it records every turn the least way instead (`least_store`: one INSERT and one
UPDATE a turn, group-committed), a yardstick for the gateway's store.

Not a product: errors are minimal (502 when the worker fails) and nothing else is recorded.

    python -m sessiongate.benchmarks.floor_proxy --port 31100 --worker http://127.0.0.1:31001 --worker ...
    python -m sessiongate.benchmarks.floor_proxy --port 31100 --worker ... --database-url sqlite+aiosqlite:///f.db
"""

from __future__ import annotations

import argparse
import zlib
from datetime import UTC, datetime
from typing import Any

import orjson

from sessiongate.gateway.server_protocol import run_server
from sessiongate.gateway.workers.http1 import Http1Pool, ProtocolError

from .least_store import LeastStore

__all__ = ["FloorProxy"]

_PATH = b"/v1/chat/completions"
_TENANT = "default"


class FloorProxy:
    """The ASGI app: one route, everything else 404. `database_url`: record every turn there (the stored floor);
    `least_store`: record every turn in this SQLite file through `least_store.LeastStore` instead (the least
    persistence, a yardstick)."""

    def __init__(self, workers: list[str], *, database_url: str | None = None, least_store: str | None = None) -> None:
        self.workers = workers
        self.pool = Http1Pool(connect_timeout_s=5.0, read_timeout_s=60.0)
        self.database_url = database_url
        self.least_store = least_store
        self.store: Any = None

    async def open(self) -> None:
        if self.least_store is not None:
            self.store = LeastStore(self.least_store)
        elif self.database_url is not None:
            from sessiongate import sessions

            await sessions.upgrade(self.database_url)
            self.store = sessions.SqlSessionStore(sessions.create_engine(self.database_url))

    async def close(self) -> None:
        await self.pool.close()
        if self.store is not None:
            await self.store.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await self.open()
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await self.close()
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
        turn = None
        if self.store is not None:
            received = datetime.now(UTC)
            request = {k: body[k] for k in ("model", "stream", "max_tokens") if k in body}
            turn = await self.store.begin_turn(
                session.decode(),
                tenant_id=_TENANT,
                create_session=True,
                messages=body["messages"],
                request=request,
                received_at=received,
            )
        # What the gateway adds to every turn (its tenant's salt, the session's priority, the cache report).
        body["cache_salt"] = "floor"
        body["priority"] = 0
        body["return_cached_tokens_details"] = True
        upstream = orjson.dumps(body)
        try:
            if body.get("stream"):
                await self._relay(send, worker, upstream, turn)
            else:
                status, content = await self.pool.post_json(worker, "/v1/chat/completions", upstream)
                if turn is not None:
                    await self._record(turn.id, worker, orjson.loads(content), turn.received_at)
                await _answer(send, status, content)
        except (TimeoutError, OSError, ProtocolError):
            if turn is not None:
                await self._record_failure(turn.id)
            await _answer(send, 502, b'{"error":"worker failed"}')

    async def _relay(self, send: Any, worker: str, upstream: bytes, turn: Any) -> None:
        async with self.pool.stream_json(worker, "/v1/chat/completions", upstream) as (status, stream):
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            parts: list[str] = []
            usage: Any = None
            partial = b""
            while chunk := await stream.read():
                if turn is not None:  # the answer's text and usage, to record
                    *lines, partial = (partial + chunk).split(b"\n")
                    for line in lines:
                        if line.startswith(b"data: {"):
                            event = orjson.loads(line[6:])
                            for choice in event.get("choices") or ():
                                parts.append((choice.get("delta") or {}).get("content") or "")
                            usage = event.get("usage") or usage
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if turn is not None:
                answer = {"choices": [{"message": {"role": "assistant", "content": "".join(parts)}}], "usage": usage}
                await self._record(turn.id, worker, answer, turn.received_at)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _record(self, turn_id: str, worker: str, answer: dict[str, Any], dispatched_at: datetime) -> None:
        choice = (answer.get("choices") or [{}])[0]
        await self.store.complete_turn(
            turn_id,
            output_message=choice.get("message") or {},
            finish_reason=choice.get("finish_reason"),
            model=answer.get("model"),
            usage=answer.get("usage"),
            cached_tokens_details=None,
            first_token_at=None,
            ended_at=datetime.now(UTC),
            worker=worker,
            dispatched_at=dispatched_at,
        )

    async def _record_failure(self, turn_id: str) -> None:
        await self.store.fail_turn(
            turn_id,
            status="failed",
            error_type="WorkerUnreachable",
            error_message="worker failed",
            ended_at=datetime.now(UTC),
            partial_output=None,
            first_token_at=None,
        )


async def _answer(send: Any, status: int, content: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker", action="append", required=True)
    parser.add_argument("--database-url", help="record every turn in this store (the stored floor)")
    parser.add_argument("--least-store", help="record every turn in this SQLite file, the least way (a yardstick)")
    args = parser.parse_args(argv)
    app = FloorProxy(args.worker, database_url=args.database_url, least_store=args.least_store)
    run_server(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
