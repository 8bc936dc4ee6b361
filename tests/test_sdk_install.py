"""`pip install sessiongate` is the SDK alone: into a clean virtual environment (its own pip, dependencies resolved
from the package index) it brings httpx and nothing of the gateway, and the SDK installed there drives a real
gateway (`sessiongate serve` from this checkout, in front of the fake SGLang worker): a session, a typing hint, a
turn. The gateway's own commands, run from that environment, say which extra they need."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessiongate.benchmarks.processes import FakeWorkerProcess, GatewayServer, local_gateway_env

pytestmark = pytest.mark.slow

# What the gateway, the store and the worker bring; none of it may come with the SDK.
GATEWAY_DEPENDENCIES = {
    "starlette", "uvicorn", "sqlalchemy", "alembic", "aiosqlite", "pydantic", "pydantic-settings", "aiohttp",
    "structlog", "prometheus-client", "orjson", "uvloop", "httptools", "httpx-aiohttp", "torch", "sglang",
}  # fmt: skip


@pytest.fixture(scope="module")
def sdk_env(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a clean venv holding `pip install <the built wheel>` (no extras)."""
    env = tmp_path_factory.mktemp("sdk-install") / "env"
    subprocess.run([sys.executable, "-m", "venv", env], check=True, timeout=120)
    install = subprocess.run(
        [env / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q", built_wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return env / "bin"


def _installed(bin_dir: Path) -> set[str]:
    listing = subprocess.run(
        [bin_dir / "python", "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return {row["name"].lower().replace("_", "-") for row in json.loads(listing.stdout)}


def test_the_base_install_is_httpx_and_nothing_of_the_gateway(sdk_env: Path) -> None:
    installed = _installed(sdk_env)
    assert {"sessiongate", "httpx"} <= installed
    assert installed & GATEWAY_DEPENDENCIES == set()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    logs = tmp_path_factory.mktemp("sdk-install-gateway")
    worker = FakeWorkerProcess(logs)
    worker.wait_ready()
    server = GatewayServer(logs, workers=[worker.url], env=local_gateway_env(logs / "gateway.db"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        worker.stop()


def test_the_sdk_alone_drives_a_real_gateway(sdk_env: Path, gateway: GatewayServer, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from sessiongate.sdk import SessionGate

        with SessionGate(base_url={gateway.url!r}) as client:
            session = client.sessions.create(metadata={{"from": "sdk-only install"}})
            hint = session.typing("started")
            reply = session.chat([{{"role": "user", "content": "Hello from an agent"}}], max_tokens=8)
            turns = session.turns()
        loaded = sorted(name for name in sys.modules if name.startswith("sessiongate."))
        print(hint.state, len(turns), bool(reply.content), " ".join(loaded))
        """
    )
    run = subprocess.run([sdk_env / "python", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    state, turns, answered, *modules = run.stdout.split()
    assert state == "fired"  # the gateway prefetched on the SDK's typing hint
    assert (turns, answered) == ("1", "True")
    assert modules
    assert all(name.startswith("sessiongate.sdk") for name in modules)


def test_a_gateway_command_from_the_sdk_install_names_the_extra(sdk_env: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [sdk_env / "sessiongate", "serve", "--port", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert "pip install 'sessiongate[gateway]'" in run.stderr
    assert "Traceback" not in run.stderr
