"""The server protocol `sessiongate serve` runs on (`gateway.server_protocol`): a response's head goes out with the
body that follows it in one write, and is never held past the event loop's next step.

Unit tests on a transport that records its writes, then the real uvicorn server over real sockets with a spy
between the protocol and the socket's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import httpx
import pytest

from sessiongate.gateway.server_protocol import HeadHoldingTransport, HttpProtocol

from .conftest import served

pytestmark = pytest.mark.anyio

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[bytes | str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.events.append(bytes(data))

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.events.append("pause")


async def test_a_head_and_its_body_in_the_same_step_are_one_write() -> None:
    inner = RecordingTransport()
    transport = HeadHoldingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    assert inner.events == []
    assert transport.get_write_buffer_size() == len(HEAD)
    transport.write(b"{}")
    assert inner.events == [HEAD + b"{}"]
    await asyncio.sleep(0)  # the flush scheduled for the head finds nothing left
    assert inner.events == [HEAD + b"{}"]


async def test_a_head_alone_goes_out_at_the_loops_next_step() -> None:
    inner = RecordingTransport()
    transport = HeadHoldingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    await asyncio.sleep(0)
    assert inner.events == [HEAD]
    transport.write(b"{}")  # a body written later goes out as it comes
    assert inner.events == [HEAD, b"{}"]


async def test_writes_that_are_not_heads_are_not_held() -> None:
    inner = RecordingTransport()
    transport = HeadHoldingTransport(inner, asyncio.get_running_loop())
    transport.write(b"5\r\nhello\r\n")
    transport.write(memoryview(b"HTTP"))  # too short to be a head
    assert inner.events == [b"5\r\nhello\r\n", b"HTTP"]


async def test_writelines_does_not_pass_a_held_head() -> None:
    inner = RecordingTransport()
    transport = HeadHoldingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    transport.writelines([b"{", b"}"])
    assert inner.events == [HEAD + b"{}"]


async def test_close_sends_what_is_held_first_and_other_calls_reach_the_transport() -> None:
    inner = RecordingTransport()
    transport = HeadHoldingTransport(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    transport.pause_reading()  # delegated as it is
    transport.close()
    assert inner.events == ["pause", HEAD, "close"]
    assert transport.is_closing()
    await asyncio.sleep(0)
    assert inner.events == ["pause", HEAD, "close"]


# The real server


class _SocketWrites:
    """What reaches the sockets' transports: each write's bytes, per connection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def spy(self, transport: asyncio.Transport) -> asyncio.Transport:
        writes = self.writes
        write = transport.write

        class Spy:
            def __getattr__(self, name: str) -> Any:
                return getattr(transport, name)

            def write(self, data: bytes) -> None:
                writes.append(bytes(data))
                write(data)

        return Spy()  # type: ignore[return-value]


def _serve(app: Any, writes: _SocketWrites) -> contextlib.AbstractAsyncContextManager[str]:
    class SpiedProtocol(HttpProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            assert isinstance(transport, asyncio.Transport)
            super().connection_made(writes.spy(transport))

    return served(app, http=SpiedProtocol, lifespan="off", timeout_graceful_shutdown=5)


async def test_a_whole_response_is_one_write_on_the_socket() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b'{"answer":42}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    writes = _SocketWrites()
    async with _serve(app, writes) as url, httpx.AsyncClient(base_url=url) as client:
        for _ in range(3):  # kept alive: each response on the same connection, each one write
            response = await client.get("/")
            assert response.json() == {"answer": 42}
    assert len(writes.writes) == 3
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'{"answer":42}') for w in writes.writes)


async def test_a_streams_head_reaches_the_client_before_its_first_chunk_is_sent() -> None:
    first_chunk = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await first_chunk.wait()
        await send({"type": "http.response.body", "body": b"hello", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    writes = _SocketWrites()
    async with _serve(app, writes) as url, httpx.AsyncClient(base_url=url) as client:
        # A head held for its body would leave both sides waiting: a failure after 10 s, not a hang.
        try:
            with anyio.fail_after(10):
                async with client.stream("GET", "/") as response:
                    # The head arrived while the app still waits: it was not held for the body.
                    assert response.status_code == 200
                    assert response.headers["transfer-encoding"] == "chunked"
                    first_chunk.set()
                    assert await response.aread() == b"hello"
        finally:
            first_chunk.set()  # the app ends either way, and the server with it
    assert writes.writes[0].endswith(b"\r\n\r\n")  # the head alone, then the chunks
    assert b"".join(writes.writes[1:]) == b"5\r\nhello\r\n0\r\n\r\n"
