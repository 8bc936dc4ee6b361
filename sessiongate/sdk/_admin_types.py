"""Typed, read-only views of the admin API's answers: a session seen by the operator, KV operations, workers,
advisory statistics.

Frozen dataclasses built by the `parse_*` functions, each keeping its wire dict in `.raw`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._session_types import SessionInfo, Turn, parse_session, parse_turn
from ._types import JSONDict, as_mapping

__all__ = [
    "AdminSession",
    "AdminSessionDeleted",
    "Advisory",
    "AdvisoryKindStats",
    "AdvisoryStats",
    "KVOperation",
    "WorkerInfo",
    "WorkerKV",
    "parse_admin_deleted",
    "parse_admin_session",
    "parse_advisory_stats",
    "parse_kv_operation",
    "parse_worker",
    "parse_workers",
]


@dataclass(frozen=True)
class Advisory:
    """One advisory as the store keeps it (pending until settled)."""

    id: str
    kind: str
    target_worker: str | None
    outcome: str
    created_at: datetime | None
    expires_at: datetime | None
    resolved_at: datetime | None
    turn_id: str | None
    detail: JSONDict | None


@dataclass(frozen=True)
class AdminSession:
    """A session with everything the gateway knows of it: turns, advisories, where its KV is believed to be."""

    session: SessionInfo
    turns: tuple[Turn, ...]
    advisories: tuple[Advisory, ...]
    kv: JSONDict
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.session.id


@dataclass(frozen=True)
class WorkerKV:
    """One worker's answer to a KV operation: tokens of the context found (or removed) per tier, or `error`
    when the worker failed or lacks the extension."""

    worker: str
    error: str | None
    tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class KVOperation:
    session_id: str
    operation: str  # "retain" | "drop"
    workers: tuple[WorkerKV, ...]


@dataclass(frozen=True)
class AdminSessionDeleted:
    id: str
    deleted: bool
    kv: tuple[WorkerKV, ...]


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    url: str
    healthy: bool
    draining: bool
    routable: bool
    in_flight: int
    served: int
    last_error: str | None
    load: JSONDict | None
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class AdvisoryKindStats:
    outcomes: Mapping[str, int]
    skipped: int
    precision: float | None
    recall: float | None
    mean_lead_time_s: float | None
    wasted_bytes: int


@dataclass(frozen=True)
class AdvisoryStats:
    """Per signal kind, counted by the answering gateway replica since it started."""

    requests: int
    missed: int
    recall: float | None
    kinds: Mapping[str, AdvisoryKindStats]
    raw: JSONDict = field(repr=False, compare=False)


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _advisory(raw: JSONDict) -> Advisory:
    detail = raw.get("detail")
    return Advisory(
        id=str(raw["id"]),
        kind=str(raw.get("kind") or ""),
        target_worker=raw.get("target_worker"),
        outcome=str(raw.get("outcome") or ""),
        created_at=_time(raw.get("created_at")),
        expires_at=_time(raw.get("expires_at")),
        resolved_at=_time(raw.get("resolved_at")),
        turn_id=raw.get("turn_id"),
        detail=detail if isinstance(detail, Mapping) else None,
    )


def parse_admin_session(raw: JSONDict) -> AdminSession:
    return AdminSession(
        session=parse_session(raw),
        turns=tuple(parse_turn(as_mapping(t)) for t in raw.get("turns") or ()),
        advisories=tuple(_advisory(as_mapping(a)) for a in raw.get("advisories") or ()),
        kv=as_mapping(raw.get("kv")),
        raw=raw,
    )


def _worker_kv(raw: JSONDict) -> WorkerKV:
    return WorkerKV(
        worker=str(raw.get("worker") or ""),
        error=raw.get("error"),
        tokens=int(raw.get("tokens") or 0),
        device_tokens=int(raw.get("device_tokens") or 0),
        host_tokens=int(raw.get("host_tokens") or 0),
        storage_tokens=int(raw.get("storage_tokens") or 0),
        raw=raw,
    )


def parse_kv_operation(raw: JSONDict) -> KVOperation:
    return KVOperation(
        session_id=str(raw["session_id"]),
        operation=str(raw["operation"]),
        workers=tuple(_worker_kv(as_mapping(w)) for w in raw.get("workers") or ()),
    )


def parse_admin_deleted(raw: JSONDict) -> AdminSessionDeleted:
    return AdminSessionDeleted(
        id=str(raw["id"]),
        deleted=bool(raw.get("deleted", False)),
        kv=tuple(_worker_kv(as_mapping(w)) for w in raw.get("kv") or ()),
    )


def parse_worker(raw: JSONDict) -> WorkerInfo:
    load = raw.get("load")
    return WorkerInfo(
        id=str(raw["id"]),
        url=str(raw.get("url") or ""),
        healthy=bool(raw.get("healthy", False)),
        draining=bool(raw.get("draining", False)),
        routable=bool(raw.get("routable", False)),
        in_flight=int(raw.get("in_flight") or 0),
        served=int(raw.get("served") or 0),
        last_error=raw.get("last_error"),
        load=load if isinstance(load, Mapping) else None,
        raw=raw,
    )


def parse_workers(raw: JSONDict) -> list[WorkerInfo]:
    data = raw["data"]
    if not isinstance(data, list):
        raise TypeError("`data` is not a list")
    return [parse_worker(as_mapping(w)) for w in data]


def _kind_stats(raw: JSONDict) -> AdvisoryKindStats:
    outcomes = as_mapping(raw.get("outcomes"))
    return AdvisoryKindStats(
        outcomes={str(k): int(v) for k, v in outcomes.items()},
        skipped=int(raw.get("skipped") or 0),
        precision=_float(raw.get("precision")),
        recall=_float(raw.get("recall")),
        mean_lead_time_s=_float(raw.get("mean_lead_time_s")),
        wasted_bytes=int(raw.get("wasted_bytes") or 0),
    )


def parse_advisory_stats(raw: JSONDict) -> AdvisoryStats:
    return AdvisoryStats(
        requests=int(raw.get("requests") or 0),
        missed=int(raw.get("missed") or 0),
        recall=_float(raw.get("recall")),
        kinds={str(k): _kind_stats(as_mapping(v)) for k, v in as_mapping(raw.get("kinds")).items()},
        raw=raw,
    )
