"""The OpenAPI document names exactly the routes the app serves, so a new route cannot escape the fuzzing run
(which drives every operation of the document), and every path parameter and `$ref` it uses is declared."""

from __future__ import annotations

import re
from typing import Any

from starlette.routing import Route

from sessiongate.gateway.api.openapi import openapi_document
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings

# Routes kept out of the document on purpose: the chat page and its files (sessiongate/gateway/webui/page.py), not API
# operations.
PAGES = {("GET", "/ui"), ("GET", "/ui/{asset}")}


def _routes(*, in_schema: bool) -> set[tuple[str, str]]:
    app = create_app(GatewaySettings())
    served = set()
    for route in app.routes:
        assert isinstance(route, Route), f"not a plain route: {route!r}"
        if route.include_in_schema != in_schema:
            continue
        for method in route.methods or ():
            if method != "HEAD":  # Starlette adds HEAD to every GET route
                served.add((method, route.path))
    return served


def _served() -> set[tuple[str, str]]:
    return _routes(in_schema=True)


def _documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}


def test_document_covers_every_route_and_nothing_else() -> None:
    served, documented = _served(), _documented(openapi_document())
    assert served - documented == set(), "routes missing from sessiongate/gateway/api/openapi.py"
    assert documented - served == set(), "documented operations the app does not serve"


def test_only_the_chat_page_is_left_out() -> None:
    # `include_in_schema=False` must not become a way for an API route to escape the fuzzing run.
    assert _routes(in_schema=False) == PAGES


def test_path_parameters_are_declared() -> None:
    for path, operations in openapi_document()["paths"].items():
        in_path = set(re.findall(r"{(\w+)}", path))
        for method, operation in operations.items():
            declared = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert declared == in_path, f"{method.upper()} {path}"


def test_every_reference_resolves() -> None:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    references = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', str(document).replace("'", '"'))
    assert references
    assert set(references) <= set(schemas)
