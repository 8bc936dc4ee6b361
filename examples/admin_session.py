"""The operator's side, through the SDK's admin client: sessions across tenants, one session's record and KV,
the workers and draining one, the advisories' precision and recall.

It makes a small session first (two turns, the second after a typing hint), unless `--session` names one. Then:
lists sessions; shows that one (turns with their worker, cached tokens and advisory outcome, the believed KV
placement); asks every worker to retain its KV (and reports the tokens each holds per tier), then to drop it;
lists the workers, drains one (no new turns routed there), sends a turn that goes elsewhere when there is
another worker, and undrains it; prints the advisory statistics.

The admin API needs the gateway's admin key: start the gateway with one and give the same here,

    SESSIONGATE_ADMIN_KEY=change-me sessiongate up         # or bash scripts/up.sh
    SESSIONGATE_ADMIN_KEY=change-me python examples/admin_session.py [--base-url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sessiongate.sdk import AuthenticationError, PermissionDeniedError, Session, SessionGate

SYSTEM = (
    "You are the assistant of a travel agency. You answer short questions about destinations, seasons and "
    "transport in one factual sentence, without greetings, lists or follow-up questions. When you are not sure "
    "of a fact, you say so plainly instead of guessing, and you never invent prices, dates or timetables."
)


def make_session(client: SessionGate, max_tokens: int) -> Session:
    session = client.sessions.create(metadata={"example": "admin_session"})
    session.messages.append({"role": "system", "content": SYSTEM})
    session.chat([{"role": "user", "content": "When is the best season to visit Lisbon?"}], max_tokens=max_tokens)
    session.typing("started")
    time.sleep(0.3)
    session.chat([{"role": "user", "content": "And how do I get there from Porto?"}], max_tokens=max_tokens)
    return session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--admin-key", default=os.environ.get("SESSIONGATE_ADMIN_KEY"))
    parser.add_argument("--session", help="inspect this session instead of making one")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    if not args.admin_key:
        parser.error("the admin API needs the gateway's admin key: --admin-key or SESSIONGATE_ADMIN_KEY")

    with SessionGate(base_url=args.base_url, api_key=args.api_key, admin_key=args.admin_key, timeout=120) as client:
        session_id = args.session or make_session(client, args.max_tokens).id
        time.sleep(0.3)  # the gateway settles the last turn's advisory just after answering

        page = client.admin.sessions.list(limit=5)
        print("sessions (newest first):")
        for info in page.data:
            print(
                f"  {info.id}  tenant {info.tenant_id}  {info.state}  priority {info.priority}  turns {info.turn_count}"
            )

        shown = client.admin.sessions.get(session_id)
        print(f"\nsession {shown.id}: {len(shown.turns)} turns, {len(shown.advisories)} advisories")
        for turn in shown.turns:
            tiers = turn.cached_tokens_by_tier
            advisory = f"{turn.advisory.kind} -> {turn.advisory.outcome}" if turn.advisory else "none"
            print(
                f"  turn {turn.seq}: {turn.status} on {turn.worker}, cached device={tiers.device} host={tiers.host} "
                f"pool={tiers.storage}; advisory: {advisory}"
            )
        print(f"  KV believed on device: {shown.kv.get('device')}, in host memory: {shown.kv.get('host')}")

        retained = client.admin.sessions.retain_kv(session_id, ttl_ms=60_000)
        for worker in retained.workers:
            held = worker.error or f"{worker.tokens} tokens (device {worker.device_tokens}, host {worker.host_tokens}"
            print(f"  retain on {worker.worker}: {held}{'' if worker.error else f', pool {worker.storage_tokens})'}")
        dropped = client.admin.sessions.drop_kv(session_id)
        for worker in dropped.workers:
            print(f"  drop on {worker.worker}: {worker.error or f'{worker.tokens} tokens removed'}")

        workers = client.admin.workers.list()
        print("\nworkers:")
        for node in workers:
            print(f"  {node.id}  healthy {node.healthy}  routable {node.routable}  served {node.served}")
        target = workers[0].id
        drained = client.admin.workers.drain(target)
        print(f"drained {drained.id}: routable {drained.routable}")
        if len(workers) > 1 and not args.session:
            session = client.sessions.get(session_id)
            reply = session.chat([{"role": "user", "content": "Thanks!"}], max_tokens=args.max_tokens)
            print(f"  a turn while it drains went to {reply.worker}")
        undrained = client.admin.workers.undrain(target)
        print(f"undrained {undrained.id}: routable {undrained.routable}")

        stats = client.admin.advisory_stats()
        print(f"\nadvisories: {stats.requests} follow-up turns, {stats.missed} missed, recall {stats.recall}")
        for kind, figures in stats.kinds.items():
            print(f"  {kind}: outcomes {dict(figures.outcomes)}, precision {figures.precision}")

        # The tenant key (or none) does not open the admin API: 403 for a tenant key, 401 for none.
        with SessionGate(base_url=args.base_url, api_key=args.api_key, admin_key="") as tenant:
            try:
                tenant.admin.workers.list()
            except (AuthenticationError, PermissionDeniedError) as error:
                print(f"\nwithout the admin key: {error.status_code} {error.code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
