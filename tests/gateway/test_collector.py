"""`sessiongate serve` tunes the cyclic garbage collector before it serves (`server_protocol.tune_collector`): what
start-up made is frozen out of the collector's reach and young collections are rarer. Run in a child process, so
that this test process keeps its own collector settings."""

from __future__ import annotations

import json
import subprocess
import sys

from sessiongate.gateway.server_protocol import COLLECTOR_THRESHOLDS

_CHILD = """
import gc, json
import uvicorn
from sessiongate.gateway import server_protocol
seen = {}
def fake_run(app, **options):
    seen["thresholds"] = gc.get_threshold()
    seen["frozen"] = gc.get_freeze_count()
uvicorn.run = fake_run
before = {"thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count()}
server_protocol.run_server(object(), host="127.0.0.1", port=0)
print(json.dumps({"before": before, "serving": seen}))
"""


def test_the_server_runs_with_start_up_frozen_and_young_collections_rarer() -> None:
    result = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["before"]["frozen"] == 0
    assert tuple(figures["serving"]["thresholds"]) == COLLECTOR_THRESHOLDS
    assert COLLECTOR_THRESHOLDS[0] > figures["before"]["thresholds"][0], "young collections rarer than Python's"
    # The modules imported so far (the server, uvicorn, the standard library's): tens of thousands of objects.
    assert figures["serving"]["frozen"] > 10_000
