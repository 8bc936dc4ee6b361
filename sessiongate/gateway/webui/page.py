"""The chat page at `GET /ui`: static files shipped in the package (`sessiongate/gateway/webui/static/`), no build step.

The page talks to the gateway's public API like any other client (`/v1/sessions`, typing hints,
`/v1/chat/completions` streamed, `/v1/sessions/{id}/turns`), with the key the user enters, so serving it needs no
authentication and reveals nothing: the files are the same for everyone. Only the names in `_ASSETS` are served,
read from the installed package (a wheel carries them as package data), so no request path ever reaches the file
system. The routes stay out of the OpenAPI document (`include_in_schema=False`): they are a page, not the API.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sessiongate.gateway.errors import NotFound

__all__ = ["ui_routes"]

_PAGE = "chat.html"
_ASSETS = {
    "chat.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
}
# Everything the page loads comes from the gateway itself; no inline script, no other origin. `connect-src 'self'`
# is what the page needs for the API.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # Small files that change with the package: revalidate instead of serving a stale page after an upgrade.
    "cache-control": "no-cache",
}


def _read(name: str) -> bytes:
    return (files("sessiongate.gateway.webui") / "static" / name).read_bytes()


async def chat_page(request: Request) -> Response:
    return Response(_read(_PAGE), media_type="text/html; charset=utf-8", headers=_HEADERS)


async def chat_asset(request: Request) -> Response:
    name = request.path_params["asset"]
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"No such file of the chat page: {name[:64]!r}.", code="asset_not_found")
    return Response(_read(name), media_type=media_type, headers=_HEADERS)


def ui_routes() -> list[Route]:
    return [
        Route("/ui", chat_page, methods=["GET"], include_in_schema=False),
        Route("/ui/{asset}", chat_asset, methods=["GET"], include_in_schema=False),
    ]
