"""Fork two sub-agents from one context, and close them: the SDK's `session.fork()` and `session.close()`.

An orchestrator builds up a shared context (a long brief and a first answer), then forks two sub-agents from it.
Each fork is a new session that shares the parent's context: its first request resends that context and adds its
own task, so the worker finds the shared prefix in its cache (the turn reports it as cached tokens) instead of
prefilling it again. When the sub-agents are done the orchestrator closes them, then itself: the gateway drops
their KV on every worker and tier, and each worker answers with the tokens it found and freed (closing the
orchestrator frees its context and everything cached below it). The workers' load report (read through
the admin API) is printed before and after: its `device_kv_tokens_cached` (pages cached that no request holds, which
SGLang counts as free) falls by what the closes freed on the device; `device_kv_tokens_used` counts only what
running requests hold.

Run it against `sessiongate up` with an admin key (the load report is read through the admin API):

    SESSIONGATE_ADMIN_KEY=change-me sessiongate up
    SESSIONGATE_ADMIN_KEY=change-me python examples/fork_subagents.py   # --base-url, SESSIONGATE_BASE_URL
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sessiongate.sdk import SessionGate

BRIEF = (
    "You coordinate a team that plans a two-week rail trip through Europe for a family of four. The budget is "
    "modest, the children are eight and eleven, and the family prefers trains to planes, small hotels to large "
    "ones, and at most one change of city every three days. The trip starts in Paris in early June and must end in "
    "Rome. Every answer is one or two short sentences, factual, with no lists and no greetings. When you do not "
    "know something, say so instead of guessing, and never invent prices, timetables or hotel names."
)


def device_cached(admin: SessionGate) -> dict[str, int]:
    """Device KV tokens cached and held by no request, per worker, from the workers' load reports."""
    return {w.id: int((w.load or {}).get("device_kv_tokens_cached") or 0) for w in admin.admin.workers.list()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--admin-key", default=os.environ.get("SESSIONGATE_ADMIN_KEY"))
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    client = SessionGate(base_url=args.base_url, api_key=args.api_key)
    admin = SessionGate(base_url=args.base_url, api_key=args.admin_key)

    orchestrator = client.sessions.create()
    plan = orchestrator.chat(
        [{"role": "system", "content": BRIEF}, {"role": "user", "content": "Which cities should the route include?"}],
        max_tokens=args.max_tokens,
        temperature=0,
    )
    print(f"orchestrator {orchestrator.id}: {plan.content!r}")

    # Each sub-agent's own part of the prompt spans a few KV pages (64 tokens on the CPU workers): a drop frees whole
    # pages that are the session's alone, so a task shorter than a page would leave nothing of its own to free.
    tasks = [
        "You are the rail planner. Work out the first leg of the trip, from Paris to the next city on the route. "
        "Consider the direct high-speed trains, the time the children can sit still, luggage for four people, "
        "arrival before dinner, and a hotel close to the station. Then suggest the train in one sentence.",
        "You are the activities planner. Work out what the two children, eight and eleven, would enjoy in Rome on "
        "the last three days: short walks, gelato, the Colosseum early in the morning before the heat, a park for "
        "an afternoon, and one museum at most. Then suggest the best single activity in one sentence.",
    ]
    subagents = []
    for task in tasks:
        sub = orchestrator.fork()
        answer = sub.chat([{"role": "user", "content": task}], max_tokens=args.max_tokens, temperature=0)
        turn = sub.turns()[-1]
        print(
            f"sub-agent {sub.id} (fork of {orchestrator.id}, {len(sub.messages) - 2} shared messages): "
            f"{answer.content!r}"
        )
        usage = turn.usage
        prompt, cached = (usage.prompt_tokens, usage.cached_tokens) if usage is not None else (0, 0)
        print(f"    first turn: worker {turn.worker}, prompt tokens {prompt}, cached {cached}")
        subagents.append(sub)

    time.sleep(1.0)  # the gateway polls the load reports every few hundred milliseconds
    before = device_cached(admin)
    for sub in subagents:
        closed = sub.close()
        tiers = {
            tier: sum(int(e.get(f"{tier}_tokens") or 0) for e in closed.dropped)
            for tier in ("device", "host", "storage")
        }
        print(f"closed {sub.id} ({closed.info.state}): dropped {closed.dropped_tokens} tokens of KV, by tier {tiers}")
        for entry in closed.dropped:
            if "error" in entry:
                print(f"    {entry['worker']} could not drop: {entry['error']}")
    closed = orchestrator.close()
    print(
        f"closed {orchestrator.id} ({closed.info.state}): dropped {closed.dropped_tokens} tokens of KV (orchestrator)"
    )
    time.sleep(1.5)
    after = device_cached(admin)
    for worker, cached in before.items():
        print(f"load report {worker}: device KV tokens cached {cached} -> {after.get(worker, 0)} after the closes")
    client.close()
    admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
