"""The HTTP/1.1 server protocol `sessiongate serve` runs on: uvicorn's httptools protocol, a response in one write.

uvicorn writes a response's head when the app sends `http.response.start` and its body at each
`http.response.body`: two system calls and two TCP segments for every non-streamed answer, and on loopback the
kernel delivers each segment to the reader inside the writer's system call. Here a head is held until the body
that follows it in the same step of the event loop, and both go out in one write; a head whose body is not sent in
that step (a stream still waiting for its first chunk) goes out alone at the loop's next step. Nothing is
reordered or dropped: a close, or any other write, sends what is held first.

`run_server` serves an ASGI app on it as `sessiongate serve` does (the benchmarks' Python floor uses it too), with
the cyclic garbage collector tuned for a server (`tune_collector`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["COLLECTOR_THRESHOLDS", "HeadHoldingTransport", "HttpProtocol", "run_server", "tune_collector"]

_HEAD = b"HTTP/"  # how uvicorn's response heads (and its 100 Continue) begin; a body written alone never waits


class HeadHoldingTransport:
    """A transport that holds a response head written on it until the next write or the loop's next step."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:5] == _HEAD:
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(chunks))  # through `write`, so nothing passes a held head

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held is not None else 0)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:  # pause_reading, set_protocol, abort, ...: the transport's own
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `HeadHoldingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport, self.loop))  # type: ignore[arg-type]  # duck-typed: the methods uvicorn calls


COLLECTOR_THRESHOLDS = (10_000, 50, 100)
"""The collector's thresholds for a serving process (Python's own: 700, 10, 10)."""


def tune_collector() -> None:
    """Freeze what start-up made (modules, the app) out of the cyclic collector's reach and collect less often.

    Most of what a turn allocates is freed by reference counting the moment it is done with; the collector is for
    cycles (a task and its coroutine, an exception and its traceback). With Python's thresholds a gateway spent 13%
    of its time in it, in full collections above all, each holding the event loop (and every request waiting on it):
    at 1,000 sessions 8 s a minute, a full collection every 2 s of 150 ms (median); at 10,000 sessions 74.5 s of 560,
    every 4.4 s one of 408 ms (median; 623 ms the longest). Tuned, the 10,000 sessions cost 9.7 s of collection,
    300 ms the longest, and the gateway served 9-26% more turns a second (docs/benchmarks.md, "The cyclic
    collector")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def run_server(app: Any, *, host: str, port: int, **options: Any) -> None:
    """Serve `app` as `sessiongate serve` does (the benchmarks' Python floor runs on this too, to be the floor of
    this very server)."""
    tune_collector()
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=HttpProtocol,
        access_log=False,
        log_level="warning",
        lifespan="on",
        **options,
    )
