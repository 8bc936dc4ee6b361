"""Multi-turn workloads as token counts and timings, shared by the trace replay and the cluster simulator.

A `SessionTrace` is one conversation or agent run: a list of `Turn`s whose prompts extend each other exactly
(turn k's prompt is every earlier append and answer plus its own append), so a replay with synthetic text gets
real prefix-cache reuse and the simulator can count reused tokens the same way. Three loaders read the public
traces from `traces_dir()` (never copied into the repository; see the README there for sources and licences):

- `sharegpt_sessions`: ShareGPT conversations (Llama-3 token counts), human think time between turns, session
  starts all at 0 (a closed set of concurrent sessions) or as Poisson arrivals;
- `mooncake_sessions`: Kimi's conversation trace (Mooncake, FAST'25), open loop at the recorded timestamps. A
  request continues a conversation when its hash_ids start with the complete 512-token blocks of an earlier
  request and share more than the two leading blocks every request has in common; the latest such request is
  its parent. This reproduces the README's figures (29.6% continuations, gap p10/p50/p90 42/126/486 s, 83% of
  the input reused). A parent continued twice (22 in the hour) starts a new session for the second branch;
  a continuation shorter than its parent's prompt plus answer (11% of them: the service trimmed the context)
  is modelled as a one-token append;
- `agent_sessions`: SWE-agent trajectories, the gap between rounds being the tool's execution time.

`plan_hints` turns a `HintModel` (lead time, false and missed fractions, after SYMPHONY's measurements) into the
advisory hints a client would send for one session, deterministically for a given `random.Random`.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

__all__ = [
    "Hint",
    "HintModel",
    "SessionTrace",
    "TracesMissingError",
    "Turn",
    "agent_sessions",
    "mooncake_sessions",
    "plan_hints",
    "scale_tokens",
    "sharegpt_sessions",
    "traces_dir",
]

MOONCAKE_BLOCK_TOKENS = 512
# Every Kimi request starts with the same two blocks (system prompt); sharing only those is not a continuation.
_MOONCAKE_COMMON_BLOCKS = 2


class TracesMissingError(FileNotFoundError):
    """The shared traces folder (or one of its files) is not where it should be."""


@dataclass(frozen=True, slots=True)
class Turn:
    append_tokens: int  # tokens added before the model answers (turn 0's include the system / first prompt)
    output_tokens: int  # tokens the model answers
    gap_s: float  # think or tool time between the previous answer's end and this request (0 for turn 0)
    kind: str  # "first" | "user" (a human typed it: typing hint) | "tool" (tool results: tool hint)
    at_s: float | None = None  # open-loop traces: sent at max(at_s, previous answer's end)
    # "tool" turns: None when the tool's result comes inside this request (a chat-completions client); else the
    # client posted it (`POST /v1/sessions/{id}/tool_results`) when the tool returned, this many seconds before
    # this request (part of gap_s: the tool ran gap_s - result_gap_s).
    result_gap_s: float | None = None


@dataclass(frozen=True, slots=True)
class SessionTrace:
    id: str
    source: str  # "sharegpt" | "mooncake" | "agent" | "synthetic"
    start_s: float  # when turn 0 is sent, from the run start
    turns: tuple[Turn, ...]

    def prompt_tokens(self, k: int) -> int:
        """Context before turn k's answer: every earlier append and answer, plus turn k's append."""
        earlier = sum(t.append_tokens + t.output_tokens for t in self.turns[:k])
        return earlier + self.turns[k].append_tokens


@dataclass(frozen=True, slots=True)
class HintModel:
    lead_s: float = 11.3  # SYMPHONY's measured typing lead on ShareGPT-derived chat
    false_rate: float = 0.0  # share of all hints that announce a request which does not come within ttl_s
    missed_rate: float = 0.0  # share of turns (after the first) that get no hint
    ttl_s: float = 30.0  # the gateway's advisory ttl (gateway.advisor.core.AdvisorBook.ttl_s)
    # How much the leads vary: each hint's lead is drawn log-normal with this sigma around a mean of `lead_s` (a
    # user types for longer or shorter); 0: every lead is `lead_s`, so a gateway that learnt it knows each turn's time.
    lead_sigma: float = 0.0

    def lead(self, rng: random.Random) -> float:
        if self.lead_sigma <= 0.0:
            return self.lead_s  # no draw: the hints of a run without spread stay as they were
        return self.lead_s * math.exp(rng.gauss(0.0, self.lead_sigma) - self.lead_sigma**2 / 2)


@dataclass(frozen=True, slots=True)
class Hint:
    session_id: str
    turn: int | None  # the turn it announces; None for a false hint
    after_prev_end_s: float  # when it fires, seconds after the anchoring answer's end (>= 0)
    kind: str  # "typing" | "tool" | "explicit"
    # The turn whose answer's end anchors `after_prev_end_s`; None means `turn - 1`. False hints set it.
    after_turn: int | None = None
    # Open-loop traces: the hint's absolute time (the turn's at_s minus the lead); it fires at
    # max(anchor end, at_s), since the gap after an answer is only known when the answer ends.
    at_s: float | None = None


def traces_dir() -> Path:
    """`$SESSIONGATE_TRACES`, else `<repo root>/../shared/traces`."""
    configured = os.environ.get("SESSIONGATE_TRACES")
    path = Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared" / "traces"
    if not path.is_dir():
        raise TracesMissingError(f"traces folder not found: {path} (set SESSIONGATE_TRACES to the shared traces)")
    return path


def _trace_file(path: Path | None, relative: str) -> Path:
    resolved = path if path is not None else traces_dir() / relative
    if not resolved.is_file():
        raise TracesMissingError(f"trace file not found: {resolved}")
    return resolved


# --- ShareGPT ------------------------------------------------------------------------------------------------


@cache
def _sharegpt_conversations(path: Path) -> tuple[tuple[tuple[int, int], ...], ...]:
    conversations = []
    with path.open() as lines:
        for line in lines:
            turns = json.loads(line)["turns"]
            if turns:
                conversations.append(tuple((int(u), int(a)) for u, a in turns))
    return tuple(conversations)


def sharegpt_sessions(
    *,
    count: int,
    seed: int,
    arrival_rate_per_s: float | None = None,
    think_time_s: float = 20.0,
    system_tokens: int = 0,
    max_context_tokens: int | None = None,
    path: Path | None = None,
) -> list[SessionTrace]:
    """`count` conversations drawn at random (with replacement only past the trace's size).

    Think time between an answer and the next question is exponential with mean `think_time_s`; sessions start
    together at 0, or as a Poisson process of `arrival_rate_per_s`. Conversations are cut at the last turn that
    fits `max_context_tokens` (prompt plus answer); one whose first turn does not fit is replaced by another.
    """
    pool = _sharegpt_conversations(_trace_file(path, "sharegpt/turn_lengths_llama3.jsonl"))
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    sessions: list[SessionTrace] = []
    clock = 0.0
    draws = 0
    while len(sessions) < count:
        if draws >= 10 * max(count, len(pool)):
            raise ValueError(f"no ShareGPT conversation fits max_context_tokens={max_context_tokens}")
        index = order[draws % len(order)] if draws < len(order) else rng.randrange(len(pool))
        draws += 1
        turns = []
        for k, (user, assistant) in enumerate(pool[index]):
            gap = 0.0 if k == 0 else rng.expovariate(1.0 / think_time_s) if think_time_s > 0 else 0.0
            append = user + (system_tokens if k == 0 else 0)
            turns.append(Turn(max(append, 1), max(assistant, 1), gap, "first" if k == 0 else "user"))
        kept = _fit_context(turns, max_context_tokens)
        if not kept:
            continue
        if arrival_rate_per_s is not None and sessions:
            clock += rng.expovariate(arrival_rate_per_s)
        sessions.append(SessionTrace(f"sharegpt-{len(sessions)}-{index}", "sharegpt", clock, kept))
    return sessions


def _fit_context(turns: Sequence[Turn], max_context_tokens: int | None) -> tuple[Turn, ...]:
    if max_context_tokens is None:
        return tuple(turns)
    total = 0
    for k, turn in enumerate(turns):
        total += turn.append_tokens + turn.output_tokens
        if total > max_context_tokens:
            return tuple(turns[:k])
    return tuple(turns)


# --- Mooncake ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _MooncakeRequest:
    at_s: float
    input_tokens: int
    output_tokens: int
    parent: int | None


@cache
def _mooncake_requests(path: Path) -> tuple[_MooncakeRequest, ...]:
    requests: list[_MooncakeRequest] = []
    latest_by_blocks: dict[tuple[int, ...], int] = {}
    with path.open() as lines:
        for line in lines:
            row = json.loads(line)
            blocks = tuple(int(h) for h in row["hash_ids"])
            input_tokens = int(row["input_length"])
            parent = None
            for shared in range(len(blocks) - 1, _MOONCAKE_COMMON_BLOCKS, -1):
                parent = latest_by_blocks.get(blocks[:shared])
                if parent is not None:
                    break
            index = len(requests)
            requests.append(
                _MooncakeRequest(row["timestamp"] / 1000.0, input_tokens, int(row["output_length"]), parent)
            )
            # The last block is partial unless the input fills it: only complete blocks can prefix a later request.
            latest_by_blocks[blocks[: input_tokens // MOONCAKE_BLOCK_TOKENS]] = index
    return tuple(requests)


def mooncake_sessions(
    *,
    duration_s: float | None = None,
    time_scale: float = 1.0,
    max_context_tokens: int | None = None,
    path: Path | None = None,
) -> list[SessionTrace]:
    """Conversations of the Mooncake trace, open loop: each turn carries its recorded time in `at_s`.

    `duration_s` keeps the requests of the first `duration_s` seconds (of the trace's clock); `time_scale`
    multiplies every time (0.5 replays the hour in 30 minutes). A turn's `gap_s` is the time between its parent's
    and its own timestamps (think time plus the parent's service time in the recording). Turns past
    `max_context_tokens` end their session; a first request that does not fit is dropped.
    """
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    requests = _mooncake_requests(_trace_file(path, "mooncake/conversation_trace.jsonl"))
    session_of: dict[int, int] = {}
    continued: set[int] = set()
    chains: list[list[int]] = []
    for index, request in enumerate(requests):
        if duration_s is not None and request.at_s > duration_s:
            break
        parent = request.parent
        if parent is not None and parent in session_of and parent not in continued:
            continued.add(parent)
            session_of[index] = session_of[parent]
            chains[session_of[index]].append(index)
        else:
            session_of[index] = len(chains)
            chains.append([index])
    sessions: list[SessionTrace] = []
    for number, chain in enumerate(chains):
        turns: list[Turn] = []
        context = 0
        for k, index in enumerate(chain):
            request = requests[index]
            at_s = request.at_s * time_scale
            append = request.input_tokens if k == 0 else max(request.input_tokens - context, 1)
            gap = 0.0 if k == 0 else at_s - turns[-1].at_s  # type: ignore[operator]
            turns.append(Turn(max(append, 1), max(request.output_tokens, 1), gap, "first" if k == 0 else "user", at_s))
            context += turns[-1].append_tokens + turns[-1].output_tokens
        kept = _fit_context(turns, max_context_tokens)
        if kept:
            sessions.append(SessionTrace(f"mooncake-{number}", "mooncake", kept[0].at_s or 0.0, kept))
    sessions.sort(key=lambda s: (s.start_s, s.id))
    return sessions


# --- Agent trajectories --------------------------------------------------------------------------------------


@cache
def _agent_trajectories(path: Path) -> tuple[tuple[str, tuple[tuple[int, int, float], ...]], ...]:
    data = json.loads(path.read_text())
    return tuple(
        (
            str(item["traj_id"]),
            tuple((int(r["prompt_tokens"]), int(r["output_tokens"]), float(r["tool_exec_s"])) for r in item["rounds"]),
        )
        for item in data
    )


def agent_sessions(
    *,
    count: int,
    seed: int,
    max_context_tokens: int | None = None,
    path: Path | None = None,
    arrival_rate_per_s: float | None = None,
) -> list[SessionTrace]:
    """`count` agent runs, each one of the SWE-agent trajectories (drawn at random with replacement).

    Round k's tool runs between its answer and round k+1's request, so turn k+1's gap is round k's tool time.
    A round whose prompt is shorter than the previous prompt plus answer (the agent trimmed its history) is
    modelled as a one-token append. Sessions start at 0 or as Poisson arrivals of `arrival_rate_per_s`.
    """
    trajectories = _agent_trajectories(_trace_file(path, "agent/swesmith_rounds_llama3tok.json"))
    rng = random.Random(seed)
    sessions: list[SessionTrace] = []
    clock = 0.0
    for number in range(count):
        name, rounds = trajectories[rng.randrange(len(trajectories))]
        turns: list[Turn] = []
        context = 0
        for k, (prompt, output, _) in enumerate(rounds):
            append = prompt if k == 0 else max(prompt - context, 1)
            gap = 0.0 if k == 0 else rounds[k - 1][2]
            turns.append(Turn(append, max(output, 1), gap, "first" if k == 0 else "tool"))
            context += append + turns[-1].output_tokens
        kept = _fit_context(turns, max_context_tokens)
        if not kept:
            continue
        if arrival_rate_per_s is not None and number:
            clock += rng.expovariate(arrival_rate_per_s)
        sessions.append(SessionTrace(f"agent-{number}-{name[:24]}", "agent", clock, kept))
    return sessions


def scale_tokens(sessions: Iterable[SessionTrace], factor: float) -> list[SessionTrace]:
    """Every token count multiplied by `factor` (rounded, at least 1): long traces on a small CPU model."""
    if factor <= 0:
        raise ValueError("factor must be positive")

    def scaled(n: int) -> int:
        return max(round(n * factor), 1)

    return [
        replace(
            s,
            turns=tuple(
                replace(t, append_tokens=scaled(t.append_tokens), output_tokens=scaled(t.output_tokens))
                for t in s.turns
            ),
        )
        for s in sessions
    ]


# --- Hints ---------------------------------------------------------------------------------------------------


def plan_hints(session: SessionTrace, model: HintModel, rng: random.Random) -> list[Hint]:
    """The hints a client sends for `session`, in no particular order.

    Every turn after the first gets a hint `lead_s` before its request (drawn around it with `lead_sigma`; at the
    previous answer's end when the gap is shorter), except a `missed_rate` share drawn at random; a "user" turn's
    hint is a typing signal, a "tool" turn's a tool signal. False hints are added so that they are `false_rate` of
    all hints: each is anchored at the end of a turn after which no request comes within the ttl (the session's
    last turn always qualifies).
    """
    rates_ok = 0.0 <= model.false_rate < 1.0 and 0.0 <= model.missed_rate <= 1.0
    if not (rates_ok and model.lead_s >= 0.0 and model.lead_sigma >= 0.0):
        raise ValueError(f"invalid hint model: {model}")
    hints: list[Hint] = []
    for k in range(1, len(session.turns)):
        if rng.random() < model.missed_rate:
            continue
        turn = session.turns[k]
        kind = "tool" if turn.kind == "tool" else "typing"
        lead = model.lead(rng)
        at_s = None if turn.at_s is None else turn.at_s - lead
        hints.append(Hint(session.id, k, max(turn.gap_s - lead, 0.0), kind, None, at_s))
    expected_false = len(hints) * model.false_rate / (1.0 - model.false_rate)
    false_count = math.floor(expected_false) + (1 if rng.random() < expected_false % 1.0 else 0)
    if false_count:
        offset_cap = model.lead_s
        # A turn qualifies when its next request comes more than ttl after the latest false hint could fire.
        anchors = [
            k
            for k in range(len(session.turns))
            if k == len(session.turns) - 1 or session.turns[k + 1].gap_s > offset_cap + model.ttl_s
        ]
        for _ in range(false_count):
            anchor = anchors[bisect.bisect_left(anchors, rng.randrange(len(session.turns))) % len(anchors)]
            kind = "tool" if session.source == "agent" else "typing"
            hints.append(Hint(session.id, None, rng.uniform(0.0, offset_cap), kind, anchor))
    return hints
