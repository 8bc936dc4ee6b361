"""The replay driver: sessions from a trace, sent over plain HTTP (OpenAI chat API, streamed) to a running stack.

Each session's prompts extend each other exactly: turn k's messages are turn k-1's, the model's real answer, and a
synthetic message of the trace's length, so whatever a system caches between turns is really reused. Sessions run
closed loop (`concurrency` at a time, each sent as soon as the previous one ends, with the trace's think or tool
time between turns) or open loop (each at its trace start time; a turn with `at_s` is sent at
max(at_s, previous answer's end)). Every trace time is multiplied by `time_scale`.

Hints (`HintModel`, planned by `benchmarks.workloads.plan_hints`) go to the gateway's signal endpoints at their
planned times: typing as `POST /v1/sessions/{id}/typing {"state": "started"}`, tool and explicit hints as
`POST /v1/sessions/{id}/advise`. TTFT is taken at the first streamed content byte; the prompt tokens found per tier
come from `usage.prompt_tokens_details.cached_tokens_details` (the gateway) or the worker's `sglext` chunk.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from sessiongate.benchmarks.metrics import TurnRecord
from sessiongate.benchmarks.workloads import Hint, HintModel, SessionTrace, plan_hints
from sessiongate.sdk._sse import ServerSentEvent, aiter_events

from .text import SyntheticText

__all__ = ["ReplayOptions", "ReplayResult", "replay"]


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    system: str
    # Closed loop: this many sessions at a time. None: open loop, each session at its trace start time.
    concurrency: int | None = None
    time_scale: float = 1.0
    hints: HintModel | None = None
    # The measurement window: no turn is sent after this many seconds of the run (the turns in flight finish).
    max_duration_s: float | None = None
    model: str = "default"
    text: SyntheticText = field(default_factory=SyntheticText)
    # SGLang's ignore_eos: a random-weight model would otherwise stop at a random length, not the trace's.
    extra_body: Mapping[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    seed: int = 0
    progress: bool = True


@dataclass
class ReplayResult:
    records: list[TurnRecord]
    hints_sent: Counter[str] = field(default_factory=Counter)
    hint_errors: Counter[str] = field(default_factory=Counter)
    sessions_started: int = 0
    wall_s: float = 0.0


async def replay(client: httpx.AsyncClient, sessions: Sequence[SessionTrace], options: ReplayOptions) -> ReplayResult:
    """Replay `sessions` through `client` (its base_url the stack's front: gateway or router)."""
    if options.time_scale <= 0:
        raise ValueError("time_scale must be positive")
    run = _Run(client, options, total_turns=sum(len(s.turns) for s in sessions))
    with run.progress:
        async with anyio.create_task_group() as group:
            if options.concurrency is None:
                for session in sessions:
                    group.start_soon(run.open_loop_session, session)
            else:
                queue = iter(sessions)
                for _ in range(min(options.concurrency, len(sessions))):
                    group.start_soon(run.closed_loop_slot, queue)
    run.result.wall_s = run.now()
    run.result.records.sort(key=lambda r: r.sent_s)
    return run.result


class _Run:
    def __init__(self, client: httpx.AsyncClient, options: ReplayOptions, *, total_turns: int) -> None:
        self.client = client
        self.options = options
        self.start = anyio.current_time()
        self.result = ReplayResult(records=[])
        self.progress = tqdm(
            total=total_turns, desc=options.system, unit="turn", disable=not options.progress, leave=False
        )

    def now(self) -> float:
        return anyio.current_time() - self.start

    def _past_deadline(self) -> bool:
        limit = self.options.max_duration_s
        return limit is not None and self.now() >= limit

    async def closed_loop_slot(self, queue: Iterator[SessionTrace]) -> None:
        for session in queue:
            if self._past_deadline():
                return
            await self.session(session, open_loop=False)

    async def open_loop_session(self, session: SessionTrace) -> None:
        start = session.start_s * self.options.time_scale
        limit = self.options.max_duration_s
        if limit is not None and start >= limit:
            return
        await anyio.sleep_until(self.start + start)
        await self.session(session, open_loop=True)

    async def session(self, session: SessionTrace, *, open_loop: bool) -> None:
        scale = self.options.time_scale
        self.result.sessions_started += 1
        rng = random.Random(f"{self.options.seed}:{self.options.system}:{session.id}")
        planned = plan_hints(session, self.options.hints, rng) if self.options.hints else []
        anchored: dict[int, list[Hint]] = {}
        for hint in planned:
            anchor = hint.after_turn if hint.after_turn is not None else (hint.turn or 1) - 1
            anchored.setdefault(anchor, []).append(hint)
        messages: list[dict[str, Any]] = []
        async with anyio.create_task_group() as hints:
            previous_end = self.now()
            for k, turn in enumerate(session.turns):
                if k > 0:
                    due = previous_end + turn.gap_s * scale
                    if open_loop and turn.at_s is not None:
                        due = max(turn.at_s * scale, previous_end)
                    await anyio.sleep_until(self.start + due)
                    if self._past_deadline():
                        break
                messages.append({"role": "user", "content": self.options.text.message(turn.append_tokens, rng)})
                record, answer = await self._turn(session.id, k, messages, turn.output_tokens)
                self.result.records.append(record)
                self.progress.update(1)
                if answer is None:  # failed: the next turn still extends this one, with an answer of the right size
                    answer = self.options.text.message(turn.output_tokens, rng)
                messages.append({"role": "assistant", "content": answer})
                previous_end = self.now()
                for hint in anchored.get(k, ()):
                    fire_at = previous_end + hint.after_prev_end_s * scale
                    if open_loop and hint.at_s is not None:
                        fire_at = max(previous_end, hint.at_s * scale)
                    hints.start_soon(self._hint, hint, fire_at)

    async def _hint(self, hint: Hint, fire_at: float) -> None:
        await anyio.sleep_until(self.start + fire_at)
        if self._past_deadline():
            return  # no turn is sent after the window: its hint would be a false one
        if hint.kind == "typing":
            path, body = f"/v1/sessions/{hint.session_id}/typing", {"state": "started"}
        else:
            kind = "tool_result" if hint.kind == "tool" else "explicit"
            path, body = f"/v1/sessions/{hint.session_id}/advise", {"kind": kind}
        try:
            response = await self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            self.result.hint_errors[type(exc).__name__] += 1
            return
        if response.status_code == 202:
            self.result.hints_sent[hint.kind if hint.turn is not None else f"{hint.kind} (false)"] += 1
        else:
            self.result.hint_errors[f"HTTP {response.status_code}"] += 1

    async def _turn(
        self, session_id: str, k: int, messages: list[dict[str, Any]], output_tokens: int
    ) -> tuple[TurnRecord, str | None]:
        body = {
            "model": self.options.model,
            "messages": messages,
            "max_tokens": output_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_cached_tokens_details": True,
            **self.options.extra_body,
        }
        stream = _Stream()
        sent = self.now()
        error: str | None = None
        worker: str | None = None
        try:
            async with self.client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session_id}
            ) as response:
                worker = response.headers.get("x-sessiongate-worker")
                if response.status_code != 200:
                    error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
                else:
                    async for event in aiter_events(response.aiter_lines()):
                        if stream.feed(event) and stream.first_token_s is None:
                            stream.first_token_s = self.now()
                    if not stream.done:
                        error = "stream ended without [DONE]"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        done = self.now()
        cached = stream.cached()
        record = TurnRecord(
            system=self.options.system,
            session_id=session_id,
            turn=k,
            sent_s=sent,
            first_token_s=stream.first_token_s if error is None else None,
            done_s=done if error is None else None,
            prompt_tokens=int(stream.usage.get("prompt_tokens") or 0),
            output_tokens=int(stream.usage.get("completion_tokens") or 0),
            cached_device=cached["device"],
            cached_host=cached["host"],
            cached_pool=cached["storage"],
            worker=worker,
            error=error,
        )
        return record, None if error is not None else "".join(stream.content)


class _Stream:
    """The parts of an OpenAI chat stream the replay needs."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.usage: dict[str, Any] = {}
        self.worker_details: dict[str, Any] | None = None
        self.first_token_s: float | None = None
        self.done = False

    def feed(self, event: ServerSentEvent) -> bool:
        """Reads one event; True when it carried answer content (text or a tool call)."""
        if event.done:
            self.done = True
            return False
        chunk = event.json()
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        extension = chunk.get("sglext")
        if isinstance(extension, dict) and isinstance(extension.get("cached_tokens_details"), dict):
            self.worker_details = extension["cached_tokens_details"]
        produced = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
                produced = True
            produced = produced or bool(delta.get("tool_calls"))
        return produced

    def cached(self) -> dict[str, int]:
        """Prompt tokens found per tier: the gateway's report in usage, else the worker's own chunk, else all
        of `cached_tokens` counted as device hits (a stack that reports no tiers)."""
        prompt_details = self.usage.get("prompt_tokens_details") or {}
        details = prompt_details.get("cached_tokens_details") or self.worker_details
        if isinstance(details, dict):
            return {tier: _count(details.get(tier)) for tier in ("device", "host", "storage")}
        return {"device": _count(prompt_details.get("cached_tokens")), "host": 0, "storage": 0}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
