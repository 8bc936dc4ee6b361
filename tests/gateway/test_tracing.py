"""OpenTelemetry traces of turns and advisory prefetches, read back by a real OTLP/HTTP receiver of the test's own.

The gateway and two fake workers run behind real sockets (uvicorn), the gateway on its production transport, and
exports over OTLP/HTTP (protobuf) to a receiver on 127.0.0.1 that decodes each `ExportTraceServiceRequest`. The
receiver runs in its own thread: the exporter's last batch is sent while the gateway's lifespan ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.types import ASGIApp, Receive, Scope, Send

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.gateway.app import create_app
from sessiongate.gateway.server_protocol import HttpProtocol
from sessiongate.gateway.settings import GatewaySettings

from .conftest import served

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "one two three four five six seven eight nine ten"}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TURN_CHILDREN = {
    "sessiongate.admission",
    "sessiongate.queue",
    "sessiongate.store.begin_turn",
    "sessiongate.route",
    "sessiongate.upstream",
    "sessiongate.store.end_turn",
}


@dataclass
class Receiver:
    """What the OTLP/HTTP receiver was sent: every span, and how many export requests there were."""

    url: str
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    paths: list[str] = field(default_factory=list)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.requests += 1
            receiver.paths.append(self.path)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    receiver.spans.extend(scope_spans.spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def recording_headers(app: ASGIApp, seen: list[dict[str, str]]) -> ASGIApp:
    """The fake worker, noting the headers of each chat request it receives."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    return wrapped


@dataclass
class Stack:
    gateway_url: str
    worker_headers: list[dict[str, str]]
    behaviours: list[FakeWorkerBehaviour]
    worker_ids: tuple[str, str]


@contextlib.asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    pool: list[tuple[str, ...]] = []
    behaviours = [FakeWorkerBehaviour(pool=pool), FakeWorkerBehaviour(pool=pool)]
    seen: list[dict[str, str]] = []

    def serve(app: Any) -> contextlib.AbstractAsyncContextManager[str]:
        return served(app, http=HttpProtocol, lifespan="on")

    async with (
        serve(recording_headers(create_fake_worker(behaviours[0]), seen)) as a,
        serve(recording_headers(create_fake_worker(behaviours[1]), seen)) as b,
    ):
        settings = GatewaySettings(
            allow_unauthenticated=True,
            workers=(a, b),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
            load_poll_interval_s=0.02,
            advisory_ttl_s=5.0,
        )
        async with serve(create_app(settings)) as gateway_url:
            yield Stack(gateway_url, seen, behaviours, (a.split("//")[1], b.split("//")[1]))


def _hex(raw: bytes) -> str:
    return raw.hex()


def _attributes(span: Span) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        value = getattr(kv.value, which)
        if which == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        values[kv.key] = value
    return values


async def _prefetched(behaviours: list[FakeWorkerBehaviour]) -> None:
    deadline = time.monotonic() + 5
    while not any(p["state"] == "done" for b in behaviours for p in b.prefetches.values()):
        assert time.monotonic() < deadline, "the advisory's prefetch did not finish"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # the advisor's poll sees it done


@pytest.fixture
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


async def test_a_trace_per_turn_with_its_steps_the_workers_context_and_the_advisory_linked(
    tmp_path: Path, clean_otel_env: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as receiver:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        clean_otel_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            async with stack(tmp_path) as s, httpx.AsyncClient(base_url=s.gateway_url, timeout=30) as client:
                first = await client.post(
                    "/v1/chat/completions",
                    headers={"X-Session-Id": "traced", "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                    json={"messages": [USER], "max_tokens": 4},
                )
                assert first.status_code == 200, first.text
                typing = await client.post("/v1/sessions/traced/typing", json={"state": "started"})
                assert typing.status_code == 202
                await _prefetched(s.behaviours)
                follow_up = [USER, first.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
                second = await client.post(
                    "/v1/chat/completions",
                    headers={"X-Session-Id": "traced"},
                    json={"messages": follow_up, "max_tokens": 4, "stream": True},
                )
                assert second.status_code == 200
                turns = (await client.get("/v1/sessions/traced/turns")).json()["data"]
                assert turns[1]["advisory"]["outcome"] == "used"
                worker_headers, worker_ids = list(s.worker_headers), s.worker_ids
                served_by = [first.headers["x-sessiongate-worker"], second.headers["x-sessiongate-worker"]]

    assert set(receiver.paths) == {"/v1/traces"}
    by_trace: dict[str, list[Span]] = {}
    for span in receiver.spans:
        by_trace.setdefault(_hex(span.trace_id), []).append(span)
    turn_spans = [sp for sp in receiver.spans if sp.name == "sessiongate.turn"]
    assert len(turn_spans) == 2
    assert len({_hex(sp.trace_id) for sp in turn_spans}) == 2  # one trace per turn

    # The first turn continues the client's trace: its span is the child of the client's.
    first_turn = next(sp for sp in turn_spans if _hex(sp.trace_id) == CLIENT_TRACE)
    assert _hex(first_turn.parent_span_id) == CLIENT_SPAN
    second_turn = next(sp for sp in turn_spans if sp is not first_turn)
    assert second_turn.parent_span_id == b""  # no traceparent: a trace of its own

    for turn, worker in zip((first_turn, second_turn), served_by, strict=True):
        trace = by_trace[_hex(turn.trace_id)]
        children = {sp.name: sp for sp in trace if sp.parent_span_id == turn.span_id}
        assert set(children) == TURN_CHILDREN
        assert len(trace) == 1 + len(TURN_CHILDREN)
        attributes = _attributes(turn)
        assert attributes["sessiongate.worker"] == worker
        assert attributes["sessiongate.turn.status"] == "ok"
        assert attributes["sessiongate.session_id"] == "traced"
        route = _attributes(children["sessiongate.route"])
        assert route["sessiongate.worker"] == worker
        assert route["sessiongate.route.policy"] == "kv_aware"
        (other,) = (w for w in worker_ids if w != worker)
        assert route["sessiongate.route.beaten"] == [other]
        assert len(route["sessiongate.route.beaten_scores"]) == 1
        assert isinstance(route["sessiongate.route.score"], float)
        upstream = _attributes(children["sessiongate.upstream"])
        assert upstream["sessiongate.time_to_first_byte_ms"] > 0
        assert upstream["gen_ai.usage.input_tokens"] > 0
        assert upstream["gen_ai.usage.output_tokens"] > 0
        # The worker received the upstream span's context: same trace, that span as the parent.
        upstream_id = _hex(children["sessiongate.upstream"].span_id)
        sent = [h["traceparent"].split("-")[:3] for h in worker_headers]
        assert ["00", _hex(turn.trace_id), upstream_id] in sent

    # The advisory's prefetch is a trace of its own, and the turn it foresaw links to it.
    (prefetch,) = [sp for sp in receiver.spans if sp.name == "sessiongate.prefetch"]
    assert len(by_trace[_hex(prefetch.trace_id)]) == 1
    prefetch_attributes = _attributes(prefetch)
    assert prefetch_attributes["sessiongate.prefetch.state"] == "done"
    assert prefetch_attributes["sessiongate.prefetch.bytes"] > 0
    assert prefetch_attributes["sessiongate.prefetch.target"] == "device"
    assert prefetch_attributes["sessiongate.advisory.kind"] == "typing"
    (link,) = second_turn.links
    assert (link.trace_id, link.span_id) == (prefetch.trace_id, prefetch.span_id)
    assert _attributes(second_turn)["sessiongate.advisory.trace_id"] == _hex(prefetch.trace_id)
    assert not first_turn.links

    # The turn's log lines carry its trace and span ids.
    for turn in (first_turn, second_turn):
        turn_id = _attributes(turn)["sessiongate.turn_id"]
        lines = [e for e in logs if e.get("turn_id") == turn_id]
        assert lines
        assert all(e["trace_id"] == _hex(turn.trace_id) and e["span_id"] == _hex(turn.span_id) for e in lines)


async def test_tracing_off_exports_nothing_and_sends_no_traceparent(
    tmp_path: Path, clean_otel_env: pytest.MonkeyPatch
) -> None:
    # The receiver is there, but nothing names it: tracing stays off.
    with (
        otlp_receiver() as receiver,
        structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs,
    ):
        async with stack(tmp_path) as s, httpx.AsyncClient(base_url=s.gateway_url, timeout=30) as client:
            for stream in (False, True):
                answer = await client.post(
                    "/v1/chat/completions",
                    headers={"X-Session-Id": "untraced", "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                    json={"messages": [USER], "max_tokens": 4, "stream": stream},
                )
                assert answer.status_code == 200
            worker_headers = list(s.worker_headers)
    assert len(worker_headers) == 2
    assert all("traceparent" not in h for h in worker_headers)
    assert receiver.requests == 0
    assert logs
    assert all("trace_id" not in e for e in logs)


async def test_a_failed_turn_is_traced_with_each_attempt_and_its_error(
    tmp_path: Path, clean_otel_env: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as receiver:
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        async with stack(tmp_path) as s, httpx.AsyncClient(base_url=s.gateway_url, timeout=30) as client:
            for behaviour in s.behaviours:
                behaviour.fail_status = 500
            answer = await client.post(
                "/v1/chat/completions", headers={"X-Session-Id": "failing"}, json={"messages": [USER]}
            )
            assert answer.status_code == 500  # the worker's own status, passed on
    (turn,) = [sp for sp in receiver.spans if sp.name == "sessiongate.turn"]
    assert _attributes(turn)["sessiongate.turn.status"] == "failed"
    assert turn.status.code == turn.status.STATUS_CODE_ERROR
    attempts = [sp for sp in receiver.spans if sp.name == "sessiongate.upstream"]
    assert len(attempts) == 2  # the router's first choice, then the other worker
    assert {_attributes(sp)["sessiongate.worker"] for sp in attempts} == set(s.worker_ids)
    for attempt in attempts:
        assert attempt.parent_span_id == turn.span_id
        assert attempt.status.code == attempt.status.STATUS_CODE_ERROR
        assert _attributes(attempt)["error.type"] == "WorkerRejected"
    assert "sessiongate.store.end_turn" in {sp.name for sp in receiver.spans if sp.parent_span_id == turn.span_id}


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),  # the SDK's default endpoint, localhost:4318
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),  # not supported: said in the log, left off
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, False),
    ],
)
def test_only_the_standard_variables_naming_otlp_turn_tracing_on(
    environ: dict[str, str], on: bool, clean_otel_env: pytest.MonkeyPatch
) -> None:
    from sessiongate.gateway.observability.tracing import NO_TRACING, tracing_from_environ

    tracing = tracing_from_environ(environ)
    try:
        assert tracing.enabled is on
        assert (tracing is NO_TRACING) is not on
    finally:
        tracing.shutdown()
