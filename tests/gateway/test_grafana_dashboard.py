"""The Grafana dashboard (deploy/grafana/sessiongate.json) reads only metrics and labels the gateway exports.

A panel whose metric was renamed, or that groups by a label the metric lacks, draws nothing and says nothing: this
parses every PromQL expression of the dashboard, takes out its metric names, label matchers and `by`/`without`
labels, and checks each against what the real gateway's `/metrics` shows after streamed and non-streamed turns
and an advisory whose prefetch the next turn used.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Gateway
from .test_signals import FAST, USER, _turn, eventually

pytestmark = pytest.mark.anyio

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "sessiongate.json"

# PromQL's own words, which look like metric names to the tokenizer below.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class Query:
    expr: str
    selectors: tuple[Selector, ...]
    grouping: tuple[str, ...]


def parse(expr: str) -> Query:
    """The vector selectors and grouping labels of one PromQL expression (Grafana's `$__...` variables allowed
    in range brackets only)."""
    assert "$" not in re.sub(r"\[\$__\w+\]", "", expr), f"a Grafana variable outside a range: {expr}"
    grouping = tuple(label.strip() for _, labels in _GROUPING.findall(expr) for label in labels.split(",") if label)
    stripped = _GROUPING.sub(" ", expr)
    stripped = re.sub(r"\[[^\]]*\]", " ", stripped)  # ranges
    selectors = []
    position = 0
    while match := _IDENTIFIER.search(stripped, position):
        name, position = match.group(), match.end()
        following = stripped[position:].lstrip()
        if following.startswith("("):
            continue  # a function or an aggregation
        if name in _KEYWORDS or re.fullmatch(r"\d.*", name):
            continue
        matchers: list[tuple[str, str, str]] = []
        if following.startswith("{"):
            body_start = stripped.index("{", position) + 1
            body_end = stripped.index("}", body_start)
            body = stripped[body_start:body_end]
            offset = 0
            while offset < len(body.strip()):
                matcher = _MATCHER.match(body, offset)
                assert matcher is not None, f"unparsed label matcher in {expr}: {body[offset:]!r}"
                matchers.append((matcher.group(1), matcher.group(2), matcher.group(3)))
                offset = matcher.end()
            position = body_end + 1
        selectors.append(Selector(name, tuple(matchers)))
    assert selectors, f"no metric in {expr}"
    return Query(expr, tuple(selectors), grouping)


def dashboard_queries() -> list[tuple[str, Query]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            found.append((panel["title"], parse(target["expr"])))
    return found


def test_the_parser_sees_metrics_matchers_and_grouping() -> None:
    query = parse(
        'sum by (status, worker) (rate(sessiongate_turns_total{status!="ok", worker=~"a.*"}[$__rate_interval]))'
        " / on (worker) group_left sum(sessiongate_worker_in_flight)"
    )
    assert query.selectors == (
        Selector("sessiongate_turns_total", (("status", "!=", "ok"), ("worker", "=~", "a.*"))),
        Selector("sessiongate_worker_in_flight", ()),
    )
    assert query.grouping == ("status", "worker", "worker")
    quantile = parse("histogram_quantile(0.99, sum by (le) (rate(sessiongate_turn_seconds_bucket[5m])))")
    assert quantile.selectors == (Selector("sessiongate_turn_seconds_bucket", ()),)


async def _scrape(gw: Gateway) -> dict[str, list[dict[str, str]]]:
    """Each sample name on `/metrics`, with the label sets it has."""
    text = (await gw.client.get("/metrics")).text
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


async def _exercise(gw: Gateway) -> None:
    """Turns streamed and not, an advisory whose prefetch the next turn uses, a turn no worker could serve, and a
    worker whose load report says it evicted KV for prefetches (the fake's own prefetches never evict)."""
    next(iter(gw.workers.values())).prefetch_evicted_tokens = {"unhinted": 640}
    first = await _turn(gw, "dash", [USER])
    assert (await gw.client.post("/v1/sessions/dash/typing", json={"state": "started"})).status_code == 202

    async def prefetched() -> bool:
        return any(p["state"] == "done" for w in gw.workers.values() for p in w.prefetches.values())

    await eventually(prefetched)
    await asyncio.sleep(0.1)
    follow_up = [USER, first["choices"][0]["message"], {"role": "user", "content": "and the museums"}]
    streamed = await gw.client.post(
        "/v1/chat/completions", json={"messages": follow_up, "stream": True}, headers={"X-Session-Id": "dash"}
    )
    assert streamed.status_code == 200
    assert (await gw.client.post("/v1/chat/completions", content=b"{")).status_code == 400


async def test_every_dashboard_query_reads_metrics_and_labels_the_gateway_exports(make_gateway: Any) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    async with make_gateway(**FAST) as gw:
        await _exercise(gw)
        samples = await _scrape(gw)
    problems = []
    for title, query in queries:
        labels_here: set[str] = set()
        for selector in query.selectors:
            if selector.metric not in samples:
                problems.append(f"{title}: no metric {selector.metric}")
                continue
            label_sets = samples[selector.metric]
            labels_here |= {name for labels in label_sets for name in labels}
            for name, op, value in selector.matchers:
                if not any(name in labels for labels in label_sets):
                    problems.append(f"{title}: {selector.metric} has no label {name}")
                elif op == "=" and not any(labels.get(name) == value for labels in label_sets):
                    problems.append(f"{title}: {selector.metric} has no {name}={value!r}")
        for name in query.grouping:
            if name not in labels_here:
                problems.append(f"{title}: grouped by {name}, which none of its metrics has")
    assert not problems, "\n".join(problems)


def test_the_dashboard_covers_what_operators_ask() -> None:
    """The panels the README promises: turns, TTFT, cached tokens by tier, advisories by outcome, prefetch bytes,
    worker load, queue depth, the shared pool's call times, errors."""
    metrics = {s.metric for _, q in dashboard_queries() for s in q.selectors}
    for wanted in (
        "sessiongate_turns_total",
        "sessiongate_time_to_first_token_seconds_bucket",
        "sessiongate_prompt_tokens_total",
        "sessiongate_advisory_outcomes_total",
        "sessiongate_prefetch_bytes_total",
        "sessiongate_worker_in_flight",
        "sessiongate_worker_queued_requests",
        "sessiongate_worker_pool_call_seconds_total",
        "sessiongate_http_requests_total",
    ):
        assert wanted in metrics, wanted
