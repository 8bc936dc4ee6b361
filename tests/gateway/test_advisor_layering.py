"""The advisor is below the HTTP layer: no module of sessiongate/gateway/advisor/ imports, even through others, the
gateway's state, app or API handlers (the signal endpoints are sessiongate/gateway/api/signals.py), nor Starlette
itself."""

from __future__ import annotations

import grimp

ADVISOR = "sessiongate.gateway.advisor"
ABOVE = (
    "sessiongate.gateway.state",
    "sessiongate.gateway.app",
    "sessiongate.gateway.turn.chat",
    "sessiongate.gateway.turn.context",
    "sessiongate.gateway.api.signals",
    "sessiongate.gateway.api.sessions",
    "sessiongate.gateway.api.admin",
    "sessiongate.gateway.turn.sharing",
    "sessiongate.gateway.wiring",
)


def test_the_advisor_imports_nothing_of_the_http_layer() -> None:
    graph = grimp.build_graph("sessiongate", include_external_packages=True)
    advisor = {ADVISOR, *graph.find_descendants(ADVISOR)}
    for module in ABOVE:
        assert not graph.chain_exists(importer=ADVISOR, imported=module, as_packages=True), module
    direct = {imported for m in advisor for imported in graph.find_modules_directly_imported_by(m)}
    assert not {m for m in direct if m.split(".")[0] == "starlette"}
