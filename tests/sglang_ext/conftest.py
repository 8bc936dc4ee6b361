"""Fixtures for the SGLang-extension tests: the CPU compatibility layer in-process, a tiny model; and the
calls the tests against real workers make (`engine`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sglang_ext.cpu_compat import activate
from sessiongate.sglang_ext.hardware import has_cuda
from sessiongate.sglang_ext.ports import pick_port
from sessiongate.sglang_ext.protocol import (
    LOAD_PATH,
    PREFETCH_PATH,
    SESSIONS_PATH,
    KVOpResult,
    LoadReport,
    PrefetchAccepted,
    PrefetchStatus,
)
from sessiongate.sglang_ext.tiny_model import make_model

# Warnings that importing torch/transformers/SGLang raises in-process, none ours to fix: SGLang
# says AWQ/GGUF need CUDA, torch.utils.mkldnn uses the deprecated torch.jit.script_method, and a
# SWIG-built extension has types without __module__.
THIRD_PARTY_IMPORT_WARNINGS = (
    "ignore:Only CUDA:UserWarning",
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",
    "ignore:builtin type [Ss]wig:DeprecationWarning",
    "ignore:builtin type swigvarlink:DeprecationWarning",
)


def require_mooncake() -> None:
    """Skip the calling module where the Mooncake Store client does not import (fail under
    SESSIONGATE_REQUIRE_MOONCAKE=1, as CI sets)."""
    from sessiongate.sglang_ext.mooncake import mooncake_unavailable

    unavailable = mooncake_unavailable()
    if unavailable is None:
        return
    why = (
        f"the Mooncake Store client does not import here ({unavailable}); scripts/setup.sh installs it "
        "(the `mooncake` extra) and scripts/ensure-mooncake-libs.sh its system libraries"
    )
    if os.environ.get("SESSIONGATE_REQUIRE_MOONCAKE") == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that import the worker stack in-process (they use `cpu_compat`) tolerate its warnings."""
    for item in items:
        if "cpu_compat" in getattr(item, "fixturenames", ()):
            for spec in THIRD_PARTY_IMPORT_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(scope="session")
def cpu_compat() -> bool:
    """Make torch, torchvision and transformers importable here; True when the layer is in use.

    Only the torch/torchvision fixes: tests that compare against SGLang's own code need it unpatched.
    """
    if has_cuda():
        return False
    activate(patch_sglang=False)
    return True


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the kernel's ephemeral range (`sglang_ext.ports.pick_port`)."""
    return pick_port()


@pytest.fixture(scope="session")
def free_ports() -> Callable[[], int]:
    """Call it for a TCP port that is free on 127.0.0.1 right now."""
    return free_port


@pytest.fixture(scope="session")
def worker_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state directory for the real workers of a test session: the tiny model is made once."""
    return tmp_path_factory.mktemp("worker-state")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, cpu_compat: bool) -> Path:
    return make_model(tmp_path_factory.mktemp("models") / "tiny", "tiny")


def long_system_prompt(tag: str, facts: int = 60) -> str:
    """A system prompt several pages long (page size 64), unique per `tag` so tests do not share KV."""
    lines = (f"Fact {i}: session {tag} keeps page {i * 7} of its cache on worker {i % 3}." for i in range(facts))
    return f"[{tag}] You are a helpful assistant.\n" + "\n".join(lines)


def question(session: str) -> str:
    """A user turn several pages long, so each session owns whole pages beyond the shared prompt."""
    return " ".join(f"Session {session} asks which worker holds page {i * 11} of fact {i}." for i in range(20))


def chat(client: httpx.Client, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A greedy chat turn (8 tokens unless `max_tokens` says otherwise) that reports where its cached prompt
    tokens came from."""
    body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 8, **fields}
    response = client.post("/v1/chat/completions", json={**body, "return_cached_tokens_details": True})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def answer(response: dict[str, Any]) -> str:
    content: str = response["choices"][0]["message"]["content"]
    return content


def prefetch(client: httpx.Client, **body: Any) -> PrefetchAccepted:
    response = client.post(PREFETCH_PATH, json=body)
    assert response.status_code == 202, response.text
    return PrefetchAccepted.model_validate(response.json())


def wait_finished(client: httpx.Client, prefetch_id: str, timeout: float = 60.0) -> PrefetchStatus:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"{PREFETCH_PATH}/{prefetch_id}")
        assert response.status_code == 200, response.text
        status = PrefetchStatus.model_validate(response.json())
        if status.state not in ("queued", "running") or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def wait_for_pool_growth(pool: Path, before: int, timeout: float = 60.0) -> None:
    """Write-through reaches the pool directory in the background (a file per page)."""
    deadline = time.monotonic() + timeout
    while len(list(pool.iterdir())) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the last pages of the context follow the first ones
    assert len(list(pool.iterdir())) > before


def wait_for_pool_quiet(pool: Path, quiet_s: float = 1.0, timeout: float = 30.0) -> None:
    """Until no page file has come for `quiet_s`: the write-through of the last turns is done (a fixed second was
    not always enough on a loaded 2-core machine)."""
    deadline = time.monotonic() + timeout
    count, changed_at = len(list(pool.iterdir())), time.monotonic()
    while time.monotonic() - changed_at < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        if (now := len(list(pool.iterdir()))) != count:
            count, changed_at = now, time.monotonic()


def load_report(client: httpx.Client) -> LoadReport:
    response = client.get(LOAD_PATH)
    assert response.status_code == 200, response.text
    return LoadReport.model_validate(response.json())


def kv_op(client: httpx.Client, session_id: str, operation: str, **body: Any) -> KVOpResult:
    """A session KV operation (retain, drop) on a worker, which must succeed."""
    response = client.post(f"{SESSIONS_PATH}/{session_id}/{operation}", json=body)
    assert response.status_code == 200, response.text
    return KVOpResult.model_validate(response.json())


def cached(response: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """A chat answer's cached prompt tokens, and where they came from."""
    details: dict[str, int] = response["sglext"]["cached_tokens_details"]
    return int(response["usage"]["prompt_tokens_details"]["cached_tokens"]), details
