"""The published OpenAPI document, fuzzed with schemathesis against the real gateway (a `sessiongate serve`
process, uvicorn) in front of a fake worker process: no request it generates gets a 5xx, and the gateway is
still healthy afterwards. Bounded: a few examples per operation, so the run takes seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from benchmarks.processes import FakeWorkerProcess, GatewayServer
from gateway.openapi import openapi_document

ADMIN_KEY = "fuzz-admin-key"
MAX_EXAMPLES = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("fuzz")
    worker = FakeWorkerProcess(logs)
    gateway = None
    try:
        worker.wait_ready()
        env = {
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{logs / 'gateway.db'}",
            "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
            "SESSIONGATE_LOG_LEVEL": "warning",
        }
        gateway = GatewayServer(logs, workers=[worker.url], env=env)
        gateway.wait_ready()
        made = httpx.post(
            f"{gateway.url}/v1/admin/keys", json={"tenant": "fuzz"}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert made.status_code == 201
        yield {"url": gateway.url, "key": made.json()["key"], "gateway": gateway, "calls": []}
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


@pytest.fixture(scope="module")
def api_schema(stack: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_url(f"{stack['url']}/openapi.json")


_PATHS = openapi_document()["paths"]
OPERATIONS = [(method.upper(), path) for path, ops in _PATHS.items() for method in ops]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_server_errors(stack: dict[str, Any], api_schema: Any, method: str, path: str, mode: GenerationMode) -> None:
    key = ADMIN_KEY if path.startswith("/v1/admin") else stack["key"]
    spec = _PATHS[path][method.lower()]
    if mode is GenerationMode.NEGATIVE and not (spec.get("parameters") or spec.get("requestBody")):
        pytest.skip("nothing to make invalid: no parameters, no body")
    operation = api_schema[path][method]

    @given(operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        response = case.call(base_url=stack["url"], headers={"authorization": f"Bearer {key}"}, timeout=30)
        stack["calls"].append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()


def test_gateway_survived(stack: dict[str, Any]) -> None:
    assert stack["gateway"].process.poll() is None
    assert httpx.get(f"{stack['url']}/readyz").status_code == 200
    assert "Traceback" not in stack["gateway"].log_tail(1_000_000)
    statuses = stack["calls"]
    assert len(statuses) > 100
    assert all(status < 500 for status in statuses)
    print(f"fuzzing: {len(statuses)} requests, statuses {sorted(set(statuses))}")
