"""The published OpenAPI document, fuzzed with schemathesis against the real gateway (a `sessiongate serve`
process, uvicorn) in front of a fake worker process: no request it generates gets a 5xx, every answer's status
code, content type and body are the ones the document gives for the operation, and the gateway is still healthy
afterwards. Bounded: a few examples per operation, so the run takes seconds.

Every operation of the document is driven (tests/security/test_openapi_document.py checks that the document
names every route), admin ones with the admin key. Random ids mostly answer 404 and stop at the first lookup, so
every other case that has a session, tenant or worker id is sent with a real one instead (the fuzz tenant, its
session, the fake worker), which reaches the handlers' later code. The typing webhook is sent both as generated (no or a
wrong signature: 401) and, every other case, signed with the configured secret, which reaches its body handling.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from sessiongate.benchmarks.processes import FakeWorkerProcess, GatewayServer
from sessiongate.gateway.advisor.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from sessiongate.gateway.api.openapi import openapi_document
from sessiongate.gateway.workers.pool import worker_id_for

ADMIN_KEY = "fuzz-admin-key"
WEBHOOK_SECRET = "fuzz-webhook-secret"
TENANT = "fuzz"
SESSION_ID = "fuzz-session"
MAX_EXAMPLES = 20


@dataclass
class Stack:
    url: str
    key: str
    worker_id: str
    gateway: GatewayServer
    statuses: Counter[int] = field(default_factory=Counter)
    cases: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    def record(self, operation: str, status: int) -> None:
        self.cases[operation] += 1
        self.statuses[status] += 1
        if status >= 500:
            self.server_errors.append(f"{operation}: {status}")

    def ensure_session(self) -> None:
        """The fuzz tenant's session exists again (a DELETE case may have removed it)."""
        answer = httpx.post(
            f"{self.url}/v1/sessions", json={"session_id": SESSION_ID}, headers={"authorization": f"Bearer {self.key}"}
        )
        assert answer.status_code in (201, 409), answer.text

    def new_response(self) -> str:
        """A stored response of the fuzz tenant (a DELETE case may remove any earlier one)."""
        answer = httpx.post(
            f"{self.url}/v1/responses", json={"input": "hello"}, headers={"authorization": f"Bearer {self.key}"}
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["id"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("fuzz")
    worker = FakeWorkerProcess(logs)
    gateway = None
    try:
        worker.wait_ready()
        env = {
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{logs / 'gateway.db'}",
            "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
            "SESSIONGATE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "SESSIONGATE_LOG_LEVEL": "warning",
        }
        gateway = GatewayServer(logs, workers=[worker.url], env=env)
        gateway.wait_ready()
        made = httpx.post(
            f"{gateway.url}/v1/admin/keys", json={"tenant": TENANT}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert made.status_code == 201
        yield Stack(url=gateway.url, key=made.json()["key"], worker_id=worker_id_for(worker.url), gateway=gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


@pytest.fixture(scope="module")
def api_schema(stack: Stack) -> Any:
    return schemathesis.openapi.from_url(f"{stack.url}/openapi.json")


_PATHS = openapi_document()["paths"]
OPERATIONS = [(method.upper(), path) for path, ops in _PATHS.items() for method in ops]
WEBHOOK = "/v1/webhooks/typing"
RESPONSE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _use_real_ids(stack: Stack, case: Any, number: int) -> None:
    if number % 2:
        return
    if "session_id" in case.path_parameters:
        stack.ensure_session()
        case.path_parameters["session_id"] = SESSION_ID
    if "worker_id" in case.path_parameters:
        case.path_parameters["worker_id"] = stack.worker_id
    if "response_id" in case.path_parameters:
        case.path_parameters["response_id"] = stack.new_response()
    if "tenant_id" in case.path_parameters:
        case.path_parameters["tenant_id"] = TENANT


def _send_signed(stack: Stack, case: Any, number: int) -> int:
    """The generated webhook body, signed as a trusted sender would; with the real session every other time."""
    body = case.body
    if isinstance(body, dict) and number % 4 == 0:
        stack.ensure_session()
        body = {**body, "session_id": SESSION_ID, "tenant_id": TENANT}
    if type(body).__name__ == "NotSet":
        raw = b""
    elif isinstance(body, bytes):  # negative cases may send a body that is not JSON at all
        raw = body
    else:
        raw = orjson.dumps(body)
    timestamp = str(int(time.time()))
    headers = {"content-type": "application/json", TIMESTAMP_HEADER: timestamp}
    headers[SIGNATURE_HEADER] = sign(WEBHOOK_SECRET, timestamp, raw)
    return httpx.post(f"{stack.url}{WEBHOOK}", content=raw, headers=headers, timeout=30).status_code


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_server_errors(stack: Stack, api_schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    key = ADMIN_KEY if path.startswith("/v1/admin") else stack.key
    spec = _PATHS[path][method.lower()]
    if mode is GenerationMode.NEGATIVE and not (spec.get("parameters") or spec.get("requestBody")):
        pytest.skip("nothing to make invalid: no parameters, no body")
    operation = api_schema[path][method]
    name = f"{method} {path}"
    numbers = iter(range(1_000_000))

    @given(operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        number = next(numbers)
        if path == WEBHOOK and number % 2 == 0:
            status = _send_signed(stack, case, number)
            stack.record(name, status)
            assert status < 500, f"{name} (signed): {status}"
            return
        _use_real_ids(stack, case, number)
        headers = {"authorization": f"Bearer {key}"} if path != WEBHOOK else {}
        response = case.call(base_url=stack.url, headers=headers, timeout=30)
        stack.record(name, response.status_code)
        if path.endswith("/drain"):  # a drained worker would answer later chat cases 503, which is right
            httpx.post(
                f"{stack.url}/v1/admin/workers/{stack.worker_id}/undrain",
                headers={"authorization": f"Bearer {ADMIN_KEY}"},
            )
        case.validate_response(response, checks=RESPONSE_CHECKS)

    run()


def test_gateway_survived(stack: Stack) -> None:
    assert stack.gateway.process.poll() is None
    assert httpx.get(f"{stack.url}/readyz").status_code == 200
    assert "Traceback" not in stack.gateway.log_tail(1_000_000)
    assert set(stack.cases) == {f"{method} {path}" for method, path in OPERATIONS}
    assert sum(stack.cases.values()) > 20 * len(OPERATIONS)
    assert stack.server_errors == []
    # Real sessions and workers were reached, not only 404s for random ids.
    assert stack.statuses[200]
    assert stack.statuses[202]
    print(
        f"fuzzing: {len(stack.cases)} operations, {sum(stack.cases.values())} requests, "
        f"{len(stack.server_errors)} server errors, statuses {dict(sorted(stack.statuses.items()))}"
    )
