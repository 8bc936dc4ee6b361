"""The one table that maps transport errors to the gateway's (`upstream.translate`): each kind of failure, from the
chat pool (`http1`) or from the control traffic's httpx client, becomes the error a client of the gateway sees."""

from __future__ import annotations

import ssl

import aiohttp
import httpx
import pytest

from sessiongate.gateway.errors import UpstreamError, WorkerTimeout, WorkerUnreachable
from sessiongate.gateway.workers.http1 import ProtocolError
from sessiongate.gateway.workers.upstream import TRANSPORT_ERRORS, translate

REQUEST = httpx.Request("GET", "http://w:1/x")


def _aiohttp_refused() -> httpx.ConnectTimeout:
    """What httpx-aiohttp raises for a refused connection: a `ConnectTimeout`, the aiohttp error as its cause."""
    key = aiohttp.client_reqrep.ConnectionKey("w", 1, False, True, None, None, None)
    error = httpx.ConnectTimeout("refused", request=REQUEST)
    error.__cause__ = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))
    return error


@pytest.mark.parametrize(
    ("exc", "started", "kind", "message"),
    [
        (TimeoutError(), False, WorkerTimeout, "Worker w timed out before answering."),
        (TimeoutError(), True, WorkerTimeout, "Worker w went silent mid-stream."),
        (httpx.ReadTimeout("slow", request=REQUEST), False, WorkerTimeout, "Worker w timed out before answering."),
        (
            ConnectionRefusedError(),
            False,
            WorkerUnreachable,
            "Worker w failed before answering: ConnectionRefusedError.",
        ),
        (ConnectionResetError(), True, WorkerUnreachable, "Worker w failed mid-stream: ConnectionResetError."),
        (ProtocolError("closed"), True, WorkerUnreachable, "Worker w failed mid-stream: ProtocolError."),
        (
            httpx.ConnectError("no", request=REQUEST),
            False,
            WorkerUnreachable,
            "Worker w failed before answering: ConnectError.",
        ),
        (_aiohttp_refused(), False, WorkerUnreachable, "Worker w failed before answering: ConnectTimeout."),
        (
            ssl.SSLCertVerificationError(1, "certificate verify failed"),
            False,
            WorkerUnreachable,
            "Worker w failed before answering: its TLS certificate was not accepted",
        ),
    ],
)
def test_each_transport_error_becomes_one_gateway_error(
    exc: BaseException, started: bool, kind: type[UpstreamError], message: str
) -> None:
    assert isinstance(exc, TRANSPORT_ERRORS)  # what every call to a worker catches
    error = translate(exc, "w", started=started)
    assert type(error) is kind
    assert error.message.startswith(message)
    assert error.status_code == (504 if kind is WorkerTimeout else 502)
