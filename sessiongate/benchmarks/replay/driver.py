"""The replay driver: sessions from a trace, sent over plain HTTP (OpenAI chat API, streamed) to a running stack.

Each session's prompts extend each other exactly: turn k's messages are turn k-1's, the model's real answer, and a
synthetic message of the trace's length, so whatever a system caches between turns is really reused. Sessions run
closed loop (`concurrency` at a time, each sent as soon as the previous one ends, with the trace's think or tool
time between turns) or open loop (each at its trace start time; a turn with `at_s` is sent at
max(at_s, previous answer's end)). Every trace time is multiplied by `time_scale`, except tool times (the gap
before a "tool" turn), multiplied by `tool_time_scale` (default: `time_scale`).

Tool calls (`tool_calls=True`, the agent workloads): every request of a session carries the same `tools` list
(`RUN_TOOL`, one function with an integer-enum argument, so that constrained decoding ends after a few tokens even
with a random-weight model), and a turn that the trace follows with a tool turn names it in `tool_choice`: the
worker answers with a real tool call (SGLang's constrained decoding and tool-call parser). After the tool's time,
the next turn carries that answer (the assistant message with its `tool_calls`) and a `role: tool` message of the
trace's length for the call. With `post_tool_results`, the result is first posted to the gateway,
`POST /v1/sessions/{id}/tool_results {"tool_call_id", "content"}`, at the moment the tool returns (the tool-call
KV lifecycle's signal, and the duration it learns from). A forced turn is sent without `ignore_eos` (the grammar's
end is the answer's end; with it, SGLang decodes past the call and returns it as text) and with at least
`TOOL_CALL_MAX_TOKENS` to finish the call in.

Hints (`HintModel`, planned by `benchmarks.workloads.plan_hints`) go to the gateway's signal endpoints at their
planned times: typing as `POST /v1/sessions/{id}/typing {"state": "started"}`, tool and explicit hints as
`POST /v1/sessions/{id}/advise`. The oracle (`oracle_lead_s`) knows the future instead: for every turn after the
first, an explicit advise `oracle_lead_s(context tokens)` before the turn is sent (at the previous answer's end
when the gap is shorter), none false, none missed. TTFT is taken at the first streamed content byte; the prompt
tokens found per tier come from `usage.prompt_tokens_details.cached_tokens_details` (the gateway) or the worker's
`sglext` chunk (which the Rust routers pass through unchanged).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from sessiongate.benchmarks.metrics import TurnRecord
from sessiongate.benchmarks.workloads import Hint, HintModel, SessionTrace, plan_hints
from sessiongate.sdk._sse import ServerSentEvent, aiter_events

from .text import SyntheticText

__all__ = ["RUN_TOOL", "TOOL_CALL_MAX_TOKENS", "ReplayOptions", "ReplayResult", "replay"]

RUN_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_tool",
        "description": "Run the agent's next tool",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer", "enum": [1, 2, 3]}},
            "required": ["step"],
            "additionalProperties": False,
        },
    },
}
_FORCE_RUN_TOOL = {"type": "function", "function": {"name": "run_tool"}}
# The tiny model's call, `[{"name": "run_tool", "parameters": {"step": 2}}]` and its end, is 37 tokens.
TOOL_CALL_MAX_TOKENS = 64


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
    # Tool times (the gap before a "tool" turn) are multiplied by this instead of `time_scale`; None: `time_scale`.
    tool_time_scale: float | None = None
    # Send `tools` with every turn and force a tool call where the trace follows with a tool turn.
    tool_calls: bool = False
    # Post each tool's result to `/v1/sessions/{id}/tool_results` when it returns (a sessiongate front only).
    post_tool_results: bool = False
    # The oracle's hints in place of `hints`: the ideal lead of a prefetch of so many context tokens, in seconds.
    oracle_lead_s: Callable[[int], float] | None = None


@dataclass
class ReplayResult:
    records: list[TurnRecord]
    hints_sent: Counter[str] = field(default_factory=Counter)
    hint_errors: Counter[str] = field(default_factory=Counter)
    # Forced turns answered with a tool call ("calls") or without one ("no call": failed, or text), tool results
    # posted ("posted") and their failures ("post errors").
    tools: Counter[str] = field(default_factory=Counter)
    sessions_started: int = 0
    wall_s: float = 0.0


async def replay(client: httpx.AsyncClient, sessions: Sequence[SessionTrace], options: ReplayOptions) -> ReplayResult:
    """Replay `sessions` through `client` (its base_url the stack's front: gateway or router)."""
    if options.time_scale <= 0 or (options.tool_time_scale is not None and options.tool_time_scale <= 0):
        raise ValueError("time_scale and tool_time_scale must be positive")
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
        tool_scale = self.options.tool_time_scale if self.options.tool_time_scale is not None else scale
        self.result.sessions_started += 1
        rng = random.Random(f"{self.options.seed}:{self.options.system}:{session.id}")
        planned = plan_hints(session, self.options.hints, rng) if self.options.hints else []
        anchored: dict[int, list[Hint]] = {}
        for hint in planned:
            anchor = hint.after_turn if hint.after_turn is not None else (hint.turn or 1) - 1
            anchored.setdefault(anchor, []).append(hint)
        messages: list[dict[str, Any]] = []
        call: dict[str, Any] | None = None  # the previous answer's tool call, whose result this turn brings
        async with anyio.create_task_group() as hints:
            previous_end = self.now()
            for k, turn in enumerate(session.turns):
                if k > 0:
                    due = previous_end + turn.gap_s * (tool_scale if turn.kind == "tool" else scale)
                    if open_loop and turn.at_s is not None:
                        due = max(turn.at_s * scale, previous_end)
                    advised: anyio.Event | None = None
                    if self.options.oracle_lead_s is not None:
                        context = session.prompt_tokens(k) - turn.append_tokens
                        at = max(previous_end, due - self.options.oracle_lead_s(context))
                        advised = anyio.Event()
                        hints.start_soon(self._hint, Hint(session.id, k, 0.0, "explicit"), at, advised)
                    await anyio.sleep_until(self.start + due)
                    if self._past_deadline():
                        break
                    if advised is not None:
                        # The oracle's advise precedes its turn by definition: on a loaded machine its POST can
                        # still be in flight at the turn's due time, and a turn sent first would orphan it.
                        await advised.wait()
                content = self.options.text.message(turn.append_tokens, rng)
                if call is not None:
                    if self.options.post_tool_results:
                        await self._post_tool_result(session.id, call["id"], content)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
                else:
                    messages.append({"role": "user", "content": content})
                forced = self.options.tool_calls and k + 1 < len(session.turns) and session.turns[k + 1].kind == "tool"
                record, answer, call = await self._turn(session.id, k, messages, turn.output_tokens, forced=forced)
                self.result.records.append(record)
                self.progress.update(1)
                if forced:
                    self.result.tools["calls" if call is not None else "no call"] += 1
                if call is not None:
                    messages.append({"role": "assistant", "content": answer or "", "tool_calls": [call]})
                else:
                    if answer is None:  # failed: the next turn still extends this one, with an answer of the right size
                        answer = self.options.text.message(turn.output_tokens, rng)
                    messages.append({"role": "assistant", "content": answer})
                previous_end = self.now()
                for hint in anchored.get(k, ()):
                    fire_at = previous_end + hint.after_prev_end_s * (tool_scale if hint.kind == "tool" else scale)
                    if open_loop and hint.at_s is not None:
                        fire_at = max(previous_end, hint.at_s * scale)
                    hints.start_soon(self._hint, hint, fire_at)

    async def _post_tool_result(self, session_id: str, call_id: str, content: str) -> None:
        """The tool's result, posted as the agent would when the tool returns, before the next turn is sent."""
        try:
            response = await self.client.post(
                f"/v1/sessions/{session_id}/tool_results", json={"tool_call_id": call_id, "content": content}
            )
        except httpx.HTTPError as exc:
            self.result.tools["post errors"] += 1
            self.result.hint_errors[type(exc).__name__] += 1
            return
        if response.status_code == 202:
            self.result.tools["posted"] += 1
        else:
            self.result.tools["post errors"] += 1
            self.result.hint_errors[f"tool_results HTTP {response.status_code}"] += 1

    async def _hint(self, hint: Hint, fire_at: float, sent: anyio.Event | None = None) -> None:
        try:
            await self._send_hint(hint, fire_at)
        finally:
            if sent is not None:
                sent.set()

    async def _send_hint(self, hint: Hint, fire_at: float) -> None:
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
        self, session_id: str, k: int, messages: list[dict[str, Any]], output_tokens: int, *, forced: bool = False
    ) -> tuple[TurnRecord, str | None, dict[str, Any] | None]:
        """One streamed turn: its record, the answer's text (None when it failed) and its tool call (if any)."""
        body: dict[str, Any] = {
            "model": self.options.model,
            "messages": messages,
            "max_tokens": output_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_cached_tokens_details": True,
            **self.options.extra_body,
        }
        if self.options.tool_calls:
            body["tools"] = [RUN_TOOL]
        if forced:
            body.pop("ignore_eos", None)
            body["tool_choice"] = _FORCE_RUN_TOOL
            body["max_tokens"] = max(output_tokens, TOOL_CALL_MAX_TOKENS)
        stream = _Stream()
        sent = self.now()
        error: str | None = None
        worker: str | None = None
        try:
            async with self.client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session_id}
            ) as response:
                worker = response.headers.get("x-sessiongate-worker") or response.headers.get("x-smg-routed-worker-id")
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
        if error is not None:
            return record, None, None
        return record, "".join(stream.content), stream.tool_call()


class _Stream:
    """The parts of an OpenAI chat stream the replay needs."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.usage: dict[str, Any] = {}
        self.worker_details: dict[str, Any] | None = None
        self.first_token_s: float | None = None
        self.done = False
        self.calls: dict[int, dict[str, Any]] = {}  # the answer's tool calls by index, merged from their deltas

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
            for part in delta.get("tool_calls") or ():
                self._merge_call(part)
                produced = True
        return produced

    def _merge_call(self, part: dict[str, Any]) -> None:
        call = self.calls.setdefault(int(part.get("index") or 0), {"id": "", "name": "", "arguments": ""})
        function = part.get("function") or {}
        call["id"] = part.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        call["arguments"] += function.get("arguments") or ""

    def tool_call(self) -> dict[str, Any] | None:
        """The answer's first complete tool call, in the chat API's message form; None without one."""
        first = self.calls.get(min(self.calls)) if self.calls else None
        if first is None or not first["id"] or not first["name"]:
            return None
        return {
            "id": first["id"],
            "type": "function",
            "function": {"name": first["name"], "arguments": first["arguments"]},
        }

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
