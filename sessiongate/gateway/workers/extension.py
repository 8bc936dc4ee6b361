"""Calling the sessiongate extension's endpoints on a worker: prefetch and session KV operations.

The wire formats are `sglang_ext.protocol`'s models, validated on both sides. Transport failures become the
gateway's upstream errors (`upstream.translate`), a non-2xx answer a `WorkerRejected` with the worker's status
(404: the worker runs without the extension), a malformed answer `WorkerUnreachable`.
"""

from __future__ import annotations

from typing import Literal, TypeVar

import httpx
import orjson
import pydantic

from sessiongate.gateway.errors import WorkerRejected, WorkerUnreachable
from sessiongate.sglang_ext.protocol import (
    PREFETCH_PATH,
    SESSIONS_PATH,
    KVOpResult,
    PrefetchAccepted,
    PrefetchRequest,
    PrefetchStatus,
    SessionKVRequest,
)

from .upstream import TRANSPORT_ERRORS, translate

__all__ = ["ExtensionClient"]

M = TypeVar("M", bound=pydantic.BaseModel)


class ExtensionClient:
    def __init__(self, client: httpx.AsyncClient, *, timeout_s: float = 5.0) -> None:
        self._client = client
        self._timeout_s = timeout_s

    async def _call(
        self, model: type[M], worker_id: str, method: str, url: str, body: pydantic.BaseModel | None = None
    ) -> M:
        try:
            response = await self._client.request(
                method,
                url,
                content=body.model_dump_json(exclude_none=True) if body is not None else None,
                headers={"content-type": "application/json"} if body is not None else None,
                timeout=self._timeout_s,
            )
        except TRANSPORT_ERRORS as exc:
            raise translate(exc, worker_id) from exc
        if not 200 <= response.status_code < 300:  # a prefetch is accepted with 202
            try:
                detail = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                detail = {"message": response.text[:500]}
            raise WorkerRejected(
                response.status_code, detail if isinstance(detail, dict) else {"message": str(detail)}, worker=worker_id
            )
        try:
            return model.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise WorkerUnreachable(f"Worker {worker_id} sent a malformed answer.", worker=worker_id) from exc

    async def prefetch(self, worker_id: str, url: str, request: PrefetchRequest) -> PrefetchAccepted:
        return await self._call(PrefetchAccepted, worker_id, "POST", f"{url}{PREFETCH_PATH}", request)

    async def prefetch_status(self, worker_id: str, url: str, prefetch_id: str) -> PrefetchStatus:
        return await self._call(PrefetchStatus, worker_id, "GET", f"{url}{PREFETCH_PATH}/{prefetch_id}")

    async def cancel_prefetch(self, worker_id: str, url: str, prefetch_id: str) -> PrefetchStatus:
        return await self._call(PrefetchStatus, worker_id, "DELETE", f"{url}{PREFETCH_PATH}/{prefetch_id}")

    async def session_kv(
        self, worker_id: str, url: str, session_id: str, operation: Literal["retain", "drop"], request: SessionKVRequest
    ) -> KVOpResult:
        return await self._call(
            KVOpResult, worker_id, "POST", f"{url}{SESSIONS_PATH}/{session_id}/{operation}", request
        )
