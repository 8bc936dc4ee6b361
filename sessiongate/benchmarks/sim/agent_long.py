"""Long-context agent sessions for the tool-call KV experiment: the SWE-agent trajectories, stretched to 32k-128k.

The trace's five SWE-agent trajectories (`/work/shared/traces/agent`, README) grow to 9k-39k tokens over 21-32
rounds, with their recorded tool times (0 or about 0.5 s) between rounds. Coding agents on large repositories
carry much longer contexts, so each session draws a final context uniformly in [`min_context`, `max_context`]
and multiplies every round's *appended* tokens (tool output, file contents: what makes a context long) by the
factor that reaches it; the model's answers keep their recorded lengths, and so does each round's share of the
growth. Tool times are the recorded ones, times `tool_scale` (1: as recorded; the trace has no tool that runs for
seconds, so a larger scale is a stated what-if, not the trace).

With a `ResultGap`, the agents post each tool's result to the gateway when the tool returns
(`POST /v1/sessions/{id}/tool_results`) and send the next request a drawn gap later: the tool still runs its
recorded time, the round's gap grows by the result gap (`Turn.result_gap_s`). Without one, the result comes inside
the next request, as the recorded SWE-agent (a chat-completions client) sends it.

With `rounds`, each session runs that many rounds: its trajectory's rounds after the first repeat in order (an agent
that goes on working in the same context, reading and editing more files), before the stretch. Longer sessions reach
a long context with the appends at their recorded sizes (the stretch factor falls towards 1), and the first turns
are fewer of all turns (1 in `rounds`). A stated what-if, not the trace: the recorded trajectories stop at 21-32.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from sessiongate.benchmarks.workloads import SessionTrace, Turn, agent_sessions

__all__ = ["ResultGap", "closed_loop_users", "long_agent_sessions"]


@dataclass(frozen=True, slots=True)
class ResultGap:
    """Seconds between a tool's result, posted when the tool returns, and the agent's next request: `min_s`, plus
    an exponential tail of mean `tail_mean_s` when that is above 0 (a model step or a person between the two)."""

    min_s: float = 0.0
    tail_mean_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_s < 0 or self.tail_mean_s < 0:
            raise ValueError(f"a result gap is at least 0 s: {self}")

    def draw(self, rng: random.Random) -> float:
        return self.min_s + (rng.expovariate(1.0 / self.tail_mean_s) if self.tail_mean_s > 0 else 0.0)

    def label(self) -> str:
        tail = f" + an exponential tail of mean {self.tail_mean_s:g} s" if self.tail_mean_s else ""
        return f"{self.min_s:g} s{tail}"


def long_agent_sessions(
    *,
    count: int,
    seed: int,
    min_context: int = 32_768,
    max_context: int = 131_072,
    tool_scale: float = 1.0,
    result_gap: ResultGap | None = None,
    rounds: int | None = None,
    path: Path | None = None,
) -> list[SessionTrace]:
    rng = random.Random(f"long-agents:{seed}")
    # Its own stream, so that posting results leaves every context and tool time as without.
    gap_rng = random.Random(f"result-gaps:{seed}")
    stretched: list[SessionTrace] = []
    for session in agent_sessions(count=count, seed=seed, path=path):
        if rounds is not None:
            session = _repeated(session, rounds)
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
            tool_s = turn.gap_s * tool_scale
            if result_gap is not None and turn.kind == "tool":
                after = result_gap.draw(gap_rng)
                turns.append(dataclasses.replace(turn, append_tokens=append, gap_s=tool_s + after, result_gap_s=after))
            else:
                turns.append(dataclasses.replace(turn, append_tokens=append, gap_s=tool_s))
        if len(turns) >= 2:
            stretched.append(dataclasses.replace(session, turns=tuple(turns)))
    return stretched


def _repeated(session: SessionTrace, rounds: int) -> SessionTrace:
    """`session` with exactly `rounds` rounds: the first, then the later rounds over and over in their order (cut
    when there are more than `rounds`)."""
    if rounds < 2:
        raise ValueError(f"a session has at least 2 rounds: {rounds}")
    first, later = session.turns[0], session.turns[1:]
    if not later:
        return session
    turns = [first, *itertools.islice(itertools.cycle(later), rounds - 1)]
    return dataclasses.replace(session, turns=tuple(turns))


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
