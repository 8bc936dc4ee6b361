"""The non-streamed turn's HTTP/1.1 client (`gateway.workers.http1`) against a raw TCP server that answers as scripted.

The server speaks bytes, so each test decides exactly how the answer is framed (length, chunked, until close) and
how the connection behaves (kept alive, closed, silent), which a real HTTP server would not let a test choose.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from sessiongate.gateway.workers.http1 import Http1Pool, ProtocolError
from sessiongate.gateway.workers.load import LoadPoller
from sessiongate.gateway.workers.pool import WorkerPool
from sessiongate.sglang_ext.protocol import LoadReport

pytestmark = pytest.mark.anyio

BODY = b'{"ok":true}'
LENGTH = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n" + BODY

# The request's bytes -> what to send: bytes, None (nothing), or a list of bytes to send and events to wait for
# (each cleared once it fired) in between.
Answer = Callable[[bytes], "bytes | list[bytes | asyncio.Event] | None"]


@asynccontextmanager
async def server(answer: Answer, *, close_after: bool = False) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A server on 127.0.0.1; yields its URL, the requests it read and the number of connections it accepted.
    On the way out its connections are closed and their handlers end (none is left for the next test)."""
    requests: list[bytes] = []
    connections = [0]
    handlers: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        writers.append(writer)
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                request = head + await reader.readexactly(length)
                requests.append(request)
                out = answer(request)
                for part in out if isinstance(out, list) else [out]:
                    if isinstance(part, asyncio.Event):
                        await part.wait()
                        part.clear()
                    elif part is not None:
                        writer.write(part)
                        await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", requests, connections
    finally:
        listener.close()
        for writer in writers:
            writer.close()  # a handler waiting for the next request reads the end and returns
        if handlers:
            await asyncio.wait(handlers, timeout=5)


def pool(**kwargs: float) -> Http1Pool:
    return Http1Pool(connect_timeout_s=2, read_timeout_s=kwargs.pop("read_timeout_s", 2), **kwargs)  # type: ignore[arg-type]


async def test_requests_reuse_one_kept_alive_connection_and_send_the_body_and_headers() -> None:
    client = Http1Pool(connect_timeout_s=2, read_timeout_s=2, headers={"Authorization": "Bearer k"})
    async with server(lambda _: LENGTH) as (url, requests, connections):
        for _ in range(3):
            assert await client.post_json(url, "/v1/chat/completions", b'{"a":1}') == (200, BODY)
        await client.close()
    assert connections[0] == 1
    head, _, body = requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Authorization: Bearer k" in lines
    assert b"content-length: 7" in lines
    assert body == b'{"a":1}'


async def test_a_path_prefix_in_the_worker_url_is_kept() -> None:
    client = pool()
    async with server(lambda _: LENGTH) as (url, requests, _):
        await client.post_json(url + "/prefix/", "/v1/chat/completions", b"{}")
        await client.close()
    assert requests[0].startswith(b"POST /prefix/v1/chat/completions HTTP/1.1\r\n")


async def test_chunked_answers_and_error_statuses_are_read_whole() -> None:
    chunked = b'HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'
    client = pool()
    async with server(lambda _: chunked) as (url, _, connections):
        assert await client.post_json(url, "/x", b"{}") == (400, b'{"a":1}')
        assert await client.post_json(url, "/x", b"{}") == (400, b'{"a":1}')
        await client.close()
    assert connections[0] == 1


async def test_connection_close_and_unframed_answers_are_not_reused() -> None:
    close = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 11\r\n\r\n" + BODY
    client = pool()
    async with server(lambda _: close, close_after=True) as (url, _, connections):
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)
    assert connections[0] == 2
    unframed = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + BODY  # ends where the connection does
    async with server(lambda _: unframed, close_after=True) as (url, _, connections):
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)
    assert connections[0] == 2
    await client.close()


async def test_a_connection_closed_mid_answer_or_garbage_is_a_protocol_error() -> None:
    client = pool()
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n" + BODY
    async with server(lambda _: cut, close_after=True) as (url, _, _):
        with pytest.raises(ProtocolError, match="before the answer was complete"):
            await client.post_json(url, "/x", b"{}")
    async with server(lambda _: b"SMTP ready\r\n\r\n") as (url, _, _):
        with pytest.raises(ProtocolError, match="malformed"):
            await client.post_json(url, "/x", b"{}")
    async with server(lambda _: b"", close_after=True) as (url, _, _):  # closed without a byte
        with pytest.raises(ProtocolError):
            await client.post_json(url, "/x", b"{}")
    await client.close()


async def test_a_silent_worker_times_out_and_its_connection_is_dropped() -> None:
    client = pool(read_timeout_s=0.2)
    answers = iter([None, LENGTH])
    async with server(lambda _: next(answers)) as (url, _, connections):
        with pytest.raises(TimeoutError):
            await client.post_json(url, "/x", b"{}")
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)  # a new connection, not the silent one
        await client.close()
    assert connections[0] == 2


async def test_a_shorter_timeout_on_a_kept_connection_is_kept_and_a_moved_deadline_is_waited_out() -> None:
    """The connection keeps one timer for its deadlines. A request with a 5 s timeout leaves it pending on the kept
    connection; a GET with 0.2 s on the same connection to a now silent worker still times out in about 0.2 s, not 5.
    And a timer set for an earlier request does not time out a later one that is still within its own deadline:
    requests 0.15 s apart, each answered 0.1 s after it was sent, with a read timeout of 0.2 s, all succeed."""
    client = pool(read_timeout_s=5)
    answers = iter([LENGTH, None])
    async with server(lambda _: next(answers)) as (url, _, connections):
        assert await client.post_json(url, "/x", b"{}") == (200, BODY)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await client.get_json(url, "/x", timeout_s=0.2)
        assert 0.15 < loop.time() - started < 2
        await client.close()
    assert connections[0] == 1

    client = pool(read_timeout_s=0.2)
    gate = asyncio.Event()

    async def answer_later() -> None:
        await asyncio.sleep(0.1)
        gate.set()

    async with server(lambda _: [gate, LENGTH]) as (url, _, connections):
        for _ in range(4):
            pacer = asyncio.create_task(answer_later())
            assert await client.post_json(url, "/x", b"{}") == (200, BODY)
            await pacer
            await asyncio.sleep(0.05)
        await client.close()
    assert connections[0] == 1


async def test_a_refused_connection_raises_connection_refused() -> None:
    async with server(lambda _: LENGTH) as (url, _, _):
        pass  # closed: nothing listens on its port any more
    with pytest.raises(ConnectionRefusedError):
        await pool().post_json(url, "/x", b"{}")


async def test_idle_connections_older_than_the_keep_alive_are_not_reused() -> None:
    client = pool(keepalive_s=0.05)
    async with server(lambda _: LENGTH) as (url, _, connections):
        await client.post_json(url, "/x", b"{}")
        await asyncio.sleep(0.1)
        await client.post_json(url, "/x", b"{}")
        await client.close()
    assert connections[0] == 2


async def test_only_http_and_https_urls_are_taken() -> None:
    with pytest.raises(ValueError, match="http and https only"):
        await pool().post_json("ftp://worker:21", "/x", b"{}")


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def test_a_stream_is_read_as_it_arrives_and_its_connection_reused_once_read_to_the_end() -> None:
    client = pool()
    gate = asyncio.Event()  # the first event must reach the reader before the rest is sent
    rest = _chunk(b"data: 2\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    async with server(lambda _: [SSE_HEAD + _chunk(b"data: 1\n\n"), gate, rest]) as (url, requests, connections):
        for _ in range(2):
            async with client.stream_json(url, "/v1/chat/completions", b"{}") as (status, stream):
                assert status == 200
                assert await stream.read() == b"data: 1\n\n"
                gate.set()
                assert await stream.read_all() == b"data: 2\n\ndata: [DONE]\n\n"
        await client.close()
    assert connections[0] == 1  # back in the pool after each complete stream
    assert all(b"accept: text/event-stream" in request for request in requests)


async def test_a_stream_left_early_closes_its_connection() -> None:
    client = pool()
    async with server(lambda _: SSE_HEAD + _chunk(b"data: 1\n\n")) as (url, _, connections):
        for _ in range(2):
            async with client.stream_json(url, "/x", b"{}") as (_, stream):
                assert await stream.read() == b"data: 1\n\n"
        await client.close()
    assert connections[0] == 2


async def test_a_stream_cut_mid_way_or_silent_raises_from_its_reads() -> None:
    client = pool(read_timeout_s=0.2)
    cut = SSE_HEAD + _chunk(b"data: 1\n\n")
    async with server(lambda _: cut, close_after=True) as (url, _, _), client.stream_json(url, "/x", b"{}") as (_, s):
        assert await s.read() == b"data: 1\n\n"
        with pytest.raises(ProtocolError, match="before the answer was complete"):
            await s.read()
    async with server(lambda _: SSE_HEAD) as (url, _, _), client.stream_json(url, "/x", b"{}") as (_, s):
        with pytest.raises(TimeoutError):
            await s.read()
    async with server(lambda _: None) as (url, _, _):  # no status line at all
        with pytest.raises(TimeoutError):
            async with client.stream_json(url, "/x", b"{}"):
                pass
    await client.close()


async def test_an_error_status_opens_a_stream_whose_body_is_the_error() -> None:
    answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 11\r\n\r\n" + BODY
    client = pool()
    async with server(lambda _: answer) as (url, _, _):
        async with client.stream_json(url, "/x", b"{}") as (status, stream):
            assert (status, await stream.read_all()) == (503, BODY)
        await client.close()


async def test_the_read_timeout_bounds_each_wait_not_the_whole_stream() -> None:
    """Five pieces 0.1 s apart with a read timeout of 0.25 s: the stream takes longer than the timeout and is read
    to its end (a silence longer than the timeout: `test_a_stream_cut_mid_way_or_silent_raises_from_its_reads`)."""
    client = pool(read_timeout_s=0.25)
    gate = asyncio.Event()
    events = [f"data: {n}\n\n".encode() for n in range(5)]
    pieces: list[bytes | asyncio.Event] = [SSE_HEAD]
    for event in events:
        pieces += [gate, _chunk(event)]
    pieces += [gate, b"0\r\n\r\n"]

    async def pace() -> None:
        for _ in range(len(events) + 1):
            await asyncio.sleep(0.1)
            gate.set()

    async with server(lambda _: pieces) as (url, _, _):
        async with client.stream_json(url, "/x", b"{}") as (status, stream):
            pacer = asyncio.create_task(pace())
            started = asyncio.get_running_loop().time()
            assert (status, await stream.read_all()) == (200, b"".join(events))
            assert asyncio.get_running_loop().time() - started > 0.5
            await pacer
        await client.close()


_REPORT = (
    b'{"at": 1.0, "running_requests": 2, "queued_requests": 3, "device_kv_tokens_total": 100,'
    b' "device_kv_tokens_used": 10, "prefill_tokens_per_s": 5000.0, "decode_tokens_per_s": 100.0, "page_size": 1}'
)


def _json_answer(status: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


async def test_a_get_has_no_body_and_reads_the_answer_on_a_kept_connection() -> None:
    client = pool()
    async with server(lambda _: _json_answer(b"200 OK", BODY)) as (url, requests, connections):
        for _ in range(2):
            assert await client.get_json(url, "/sessiongate/v1/load", timeout_s=1) == (200, BODY)
        await client.close()
    assert requests[0].startswith(b"GET /sessiongate/v1/load HTTP/1.1\r\n")
    assert requests[0].endswith(b"content-length: 0\r\n\r\n")
    assert connections[0] == 1


async def test_the_load_poller_reads_http_workers_over_the_pool() -> None:
    """The poller's HTTP/1.1 path: a report, a worker without the extension (404), a silent one (its timeout, the
    previous report kept)."""

    answers = iter([_json_answer(b"200 OK", _REPORT), _json_answer(b"404 Not Found", b"{}"), None])
    async with server(lambda _: next(answers)) as (url, requests, _):
        unused = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: pytest.fail("went through httpx")))
        workers = WorkerPool((url,), unused, health_timeout_s=1.0, unhealthy_after=1)
        (worker,) = workers.workers
        fast = pool()
        poller = LoadPoller(workers, unused, interval_s=0.05, fast=fast)
        await poller.poll(worker)
        assert worker.extension is True
        assert worker.load is not None
        assert (worker.load.running_requests, worker.load.queued_requests) == (2, 3)
        await poller.poll(worker)
        assert (worker.extension, worker.load) == (False, None)
        previous = LoadReport.model_validate_json(_REPORT)
        worker.extension, worker.load = True, previous
        await poller.poll(worker)  # silent: times out after 1 s (the poller's floor), keeps what it had
        assert worker.load is previous
        await fast.close()
    assert len(requests) == 3
    assert all(r.startswith(b"GET /sessiongate/v1/load") for r in requests)
