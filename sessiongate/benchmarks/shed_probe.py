"""How fast a saturated gateway answers a turn it refuses, seen by a client with nothing else to do.

The load test's own client (`load_test`) runs a thousand sessions on one event loop beside the gateway, and at
saturation that loop wakes 100-250 ms late at p99: every refusal it times carries its own lateness. This probe runs
in its own process and sends, `--rate` times a second, the first turn of a new session (`probe-<n>`), each on its own
task so that a turn that is admitted holds up none of the next; from `--start-after` seconds on, for `--duration`
seconds. At saturation a new session's turn is refused at once (429 or 503 with `Retry-After`,
`gateway/turn/admission.py`), so the times of the refusals it gets are what the issue's "shed turns answered in under
50 ms" asks of the gateway. A turn the gateway admits instead is answered and recorded like any other (counted as
`admitted`: the load test adds them to the turns it checks against the store's rows). The probe's own loop lag is
measured as the load test's is, so a late probe shows.

    python -m sessiongate.benchmarks.shed_probe --url http://127.0.0.1:8000 --rate 10 --duration 30 --out probe.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from .load_figures import percentiles

__all__ = ["probe", "record_loop_lag"]

_SHED_STATUSES = (429, 503)


async def record_loop_lag(deadline: float, lags_ms: list[float]) -> None:
    """Until `deadline` (monotonic): how late this event loop wakes from a 50 ms sleep, in ms, into `lags_ms` (what of
    the latencies a client measures is its own)."""
    while time.monotonic() < deadline:
        asleep = time.perf_counter()
        await asyncio.sleep(0.05)
        lags_ms.append((time.perf_counter() - asleep - 0.05) * 1000)


async def probe(url: str, *, rate: float, start_after_s: float, duration_s: float) -> dict[str, Any]:
    """Send new sessions' first turns at `rate` a second for `duration_s` after `start_after_s`; the figures."""
    shed_ms: list[float] = []
    admitted_ms: list[float] = []
    errors: dict[str, int] = {}
    lags: list[float] = []
    await asyncio.sleep(start_after_s)
    deadline = time.monotonic() + duration_s
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

        async def one(index: int) -> None:
            body = orjson.dumps(
                {
                    "model": "fake-model",
                    "messages": [{"role": "user", "content": f"probe {index}: is anyone there?"}],
                    "max_tokens": 4,
                }
            )
            headers = {"content-type": "application/json", "x-session-id": f"probe-{index}"}
            sent = time.perf_counter()
            try:
                async with client.post(f"{url}/v1/chat/completions", data=body, headers=headers) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            took_ms = (time.perf_counter() - sent) * 1000
            if status == 200:
                admitted_ms.append(took_ms)
            elif status in _SHED_STATUSES:
                shed_ms.append(took_ms)
            else:
                errors[f"status_{status}"] = errors.get(f"status_{status}", 0) + 1

        watcher = asyncio.create_task(record_loop_lag(deadline, lags))
        tasks = []
        index = 0
        interval = 1.0 / rate
        next_at = time.monotonic()
        while next_at < deadline:
            tasks.append(asyncio.create_task(one(index)))
            index += 1
            next_at += interval
            await asyncio.sleep(max(next_at - time.monotonic(), 0.0))
        await asyncio.gather(*tasks)
        watcher.cancel()
    return {
        "sent": index,
        "shed_ms": percentiles(shed_ms),
        "admitted": len(admitted_ms),
        "admitted_ms": percentiles(admitted_ms),
        "errors": errors,
        "own_lag_ms": percentiles(lags),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="the gateway's base URL")
    parser.add_argument("--rate", type=float, default=10.0, help="turns a second")
    parser.add_argument("--start-after", type=float, default=0.0, help="seconds")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds")
    parser.add_argument("--out", help="write the figures as JSON here (default: print them)")
    args = parser.parse_args(argv)
    figures = asyncio.run(probe(args.url, rate=args.rate, start_after_s=args.start_after, duration_s=args.duration))
    text = orjson.dumps(figures, option=orjson.OPT_INDENT_2)
    if args.out:
        Path(args.out).write_bytes(text)
    else:
        print(text.decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
