"""Long-context agent sessions for the tool-call KV experiment: the SWE-agent trajectories, stretched to 32k-128k.

The trace's five SWE-agent trajectories (`/work/shared/traces/agent`, README) grow to 9k-39k tokens over 21-32
rounds, with their recorded tool times (0 or about 0.5 s) between rounds. Coding agents on large repositories
carry much longer contexts, so each session draws a final context uniformly in [`min_context`, `max_context`]
and multiplies every round's *appended* tokens (tool output, file contents: what makes a context long) by the
factor that reaches it; the model's answers keep their recorded lengths, and so does each round's share of the
growth. Tool times are the recorded ones, times `tool_scale` (1: as recorded; the trace has no tool that runs for
seconds, so a larger scale is a stated what-if, not the trace).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

from sessiongate.benchmarks.workloads import SessionTrace, Turn, agent_sessions

__all__ = ["closed_loop_users", "long_agent_sessions"]


def long_agent_sessions(
    *,
    count: int,
    seed: int,
    min_context: int = 32_768,
    max_context: int = 131_072,
    tool_scale: float = 1.0,
    path: Path | None = None,
) -> list[SessionTrace]:
    rng = random.Random(f"long-agents:{seed}")
    stretched: list[SessionTrace] = []
    for session in agent_sessions(count=count, seed=seed, path=path):
        appended = sum(t.append_tokens for t in session.turns)
        answered = sum(t.output_tokens for t in session.turns)
        target = rng.uniform(min_context, max_context)
        factor = max((target - answered) / appended, 1.0)
        turns: list[Turn] = []
        total = 0
        for turn in session.turns:
            append = max(round(turn.append_tokens * factor), 1)
            # Stay inside the window: the last rounds of a session drawn near `max_context` are cut, not squeezed.
            if total + append + turn.output_tokens > max_context:
                break
            total += append + turn.output_tokens
            turns.append(dataclasses.replace(turn, append_tokens=append, gap_s=turn.gap_s * tool_scale))
        if len(turns) >= 2:
            stretched.append(dataclasses.replace(session, turns=tuple(turns)))
    return stretched


def closed_loop_users(
    pool: list[SessionTrace], users: int, *, seed: int, think_time_s: float
) -> tuple[list[SessionTrace], dict[str, tuple[str, float]]]:
    """`users` agents, each running its share of `pool` back to back (an exponential pause between sessions), as
    `experiments.workload` builds them: the sessions and `simulate`'s `follow_ups`."""
    rng = random.Random(seed)
    sessions: list[SessionTrace] = []
    follow_ups: dict[str, tuple[str, float]] = {}
    for user in range(users):
        mine = pool[user::users]
        if not mine:
            continue
        sessions.append(dataclasses.replace(mine[0], start_s=rng.uniform(0.0, think_time_s)))
        sessions.extend(mine[1:])
        for before, after in itertools.pairwise(mine):
            follow_ups[before.id] = (after.id, rng.expovariate(1.0 / think_time_s))
    return sessions, follow_ups
