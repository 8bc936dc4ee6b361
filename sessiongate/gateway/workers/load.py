"""Reading each worker's load report (`GET /sessiongate/v1/load`) into the state the routing policies see.

One loop polls every routable worker every `interval_s` (100-500 ms is useful: a turn takes seconds, a report
costs the worker microseconds). A worker without the sessiongate extension answers 404: it is marked so and
asked again only every `_RECHECK_NO_EXTENSION` rounds; its view falls back to the gateway's own in-flight
count. A failed or malformed report keeps the previous one, which the view ignores once it is stale
(`stale_after_s`, a few intervals). Never raises out of the loop: load reports are hints.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pydantic
import structlog

from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport

from .http1 import Http1Pool, ProtocolError
from .pool import Worker, WorkerPool

__all__ = ["LoadPoller"]

log = structlog.get_logger(__name__)

_RECHECK_NO_EXTENSION = 40


class LoadPoller:
    """Polls every healthy worker's load report. `fast`: the HTTP/1.1 pool the chat turns use, which the gateway
    polls over (through httpx a poll cost about a millisecond of CPU, several times a second per worker); without
    one, `client`."""

    def __init__(
        self, pool: WorkerPool, client: httpx.AsyncClient, *, interval_s: float, fast: Http1Pool | None = None
    ) -> None:
        self.pool = pool
        self.client = client
        self.interval_s = interval_s
        self.fast = fast
        self._rounds = 0

    @property
    def stale_after_s(self) -> float:
        return max(4 * self.interval_s, 1.0)

    async def _get(self, worker: Worker) -> tuple[int, bytes] | None:
        """The load report's status and body; None when the worker could not be asked."""
        timeout_s = self.stale_after_s  # a report that took longer would be stale on arrival
        try:
            if self.fast is not None:
                return await self.fast.get_json(worker.url, LOAD_PATH, timeout_s=timeout_s)
            response = await self.client.get(f"{worker.url}{LOAD_PATH}", timeout=timeout_s)
            return response.status_code, response.content
        except (httpx.HTTPError, TimeoutError, OSError, ProtocolError) as exc:
            log.debug("load_report_failed", worker=worker.id, error=type(exc).__name__)
            return None

    async def poll(self, worker: Worker) -> None:
        asked_at_in_flight = worker.in_flight
        answer = await self._get(worker)
        if answer is None:
            return
        status, content = answer
        if status == 404:
            if worker.extension is not False:
                log.info("worker_without_extension", worker=worker.id)
            worker.extension = False
            worker.load = None
            return
        if status != 200:
            log.debug("load_report_failed", worker=worker.id, status=status)
            return
        try:
            report = LoadReport.model_validate_json(content)
        except pydantic.ValidationError:
            log.warning("load_report_malformed", worker=worker.id)
            return
        worker.extension = True
        worker.load = report
        worker.load_received_at = time.monotonic()
        # Requests sent while the report was being made may or may not be in it; count them as not in it.
        worker.in_flight_at_report = min(asked_at_in_flight, worker.in_flight)

    async def poll_all(self) -> None:
        self._rounds += 1
        due = [
            w
            for w in self.pool.workers
            if w.healthy and (w.extension is not False or self._rounds % _RECHECK_NO_EXTENSION == 0)
        ]
        await asyncio.gather(*(self.poll(w) for w in due))

    async def run(self) -> None:
        """Poll forever; cancelled at shutdown."""
        while True:
            await self.poll_all()
            await asyncio.sleep(self.interval_s)
