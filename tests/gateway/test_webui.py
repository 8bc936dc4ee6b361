"""The chat page's files, served by the real app (no browser: tests/ui/ drives the page in one).

The page and every file it names are served with the right types, whatever the gateway's authentication; a name
that is not one of the page's files is an OpenAI-format 404, paths that try to leave the folder included; and the
files the page needs are declared as package data, so a wheel install serves them too.
"""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from .conftest import Gateway, running_gateway

pytestmark = pytest.mark.anyio

STATIC = Path(__file__).resolve().parents[2] / "sessiongate" / "gateway" / "webui" / "static"


async def test_the_page_is_html_and_names_only_files_the_gateway_serves(gateway: Gateway) -> None:
    page = await gateway.client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "<textarea" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    referenced = [url for url in re.findall(r'(?:src|href)="([^"]+)"', page.text) if not url.startswith("data:")]
    assert sorted(referenced) == ["ui/chat.css", "ui/chat.js"]  # relative: the page also works under a prefix
    types = {"ui/chat.js": "text/javascript; charset=utf-8", "ui/chat.css": "text/css; charset=utf-8"}
    for path in referenced:
        asset = await gateway.client.get(f"/{path}")
        assert asset.status_code == 200, path
        assert asset.headers["content-type"] == types[path]
        assert asset.headers["x-content-type-options"] == "nosniff"
        assert asset.content == (STATIC / Path(path).name).read_bytes()


@pytest.mark.parametrize(
    "path", ["/ui/nothing.js", "/ui/chat.html.bak", "/ui/..%2Fpage.py", "/ui/%2E%2E%2F__init__.py", "/ui/py.typed"]
)
async def test_anything_else_is_a_clean_404(gateway: Gateway, path: str) -> None:
    answer = await gateway.client.get(path)
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["type"] == "not_found_error"


async def test_the_page_needs_no_key_where_the_api_does(tmp_path: Path) -> None:
    async with running_gateway(tmp_path, allow_unauthenticated=False) as gw:
        assert (await gw.client.get("/ui")).status_code == 200
        assert (await gw.client.get("/ui/chat.js")).status_code == 200
        assert (await gw.client.get("/v1/models")).status_code == 401  # the page asks for a key, then


def test_every_file_of_the_page_is_package_data() -> None:
    pyproject = tomllib.loads((STATIC.parents[3] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["sessiongate.gateway.webui"]
    shipped = sorted(STATIC.iterdir())
    assert {p.name for p in shipped} >= {"chat.html", "chat.js", "chat.css"}
    for file in shipped:
        assert any(fnmatch(f"static/{file.name}", pattern) for pattern in patterns), file.name
