"""The official `openai` package, unchanged, against sessiongate: only the base URL and one header differ.

`X-Session-Id` names the session, so every turn of this conversation is recorded as one session and routed with
its KV cache in mind. The gateway's own extras ride along without changing the client: the worker that served a
turn in the `x-sessiongate-worker` response header, the cache report in `usage.prompt_tokens_details`, and the
session's recorded turns (with each turn's advisory outcome) at `GET /v1/sessions/{id}/turns`. Before the second
turn the example sends a typing hint to the gateway's signal endpoint (plain HTTP: the OpenAI API has none).

Run it against `sessiongate up` (or `bash scripts/up.sh`):

    python examples/openai_sdk.py                         # http://127.0.0.1:8000, or SESSIONGATE_BASE_URL
    python examples/openai_sdk.py --base-url http://host:8000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import httpx
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

SYSTEM = (
    "You are the geography assistant of a travel planning app. The user is planning a trip through Europe and asks "
    "short questions about countries, their capitals, languages and currencies. Answer every question in one short, "
    "factual sentence, without lists, without greetings and without repeating the question. If you do not know an "
    "answer, say so in one sentence instead of guessing. Never invent facts about places, prices or timetables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)
    base_url = args.base_url.rstrip("/")
    session_id = f"openai-example-{uuid.uuid4().hex[:8]}"

    client = OpenAI(
        base_url=f"{base_url}/v1",
        api_key=args.api_key or "",  # empty: no Authorization header (`sessiongate up` serves callers without a key)
        default_headers={"X-Session-Id": session_id},
    )
    model = client.models.list().data[0].id
    print(f"session {session_id}, model {model}")

    # Workers cache KV in whole pages (64 tokens on `sessiongate up`'s CPU workers): a conversation shorter than a
    # page has nothing to reuse, so this one starts with a system prompt of a few pages' length.
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    for n, follow_up in enumerate(["And of Italy?", None], start=1):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=args.max_tokens,
            temperature=0,
        )
        completion = raw.parse()
        answer = completion.choices[0].message.content or ""
        usage = completion.usage
        details = usage.prompt_tokens_details if usage else None
        cached = details.cached_tokens if details else None
        print(f"[{n}] assistant: {answer!r}")
        print(f"    worker {raw.headers.get('x-sessiongate-worker')}, prompt tokens cached: {cached}")
        messages.append({"role": "assistant", "content": answer})
        if follow_up is None:
            break
        # The user starts typing the next message: the gateway prefetches the session's KV meanwhile.
        hint = httpx.post(
            f"{base_url}/v1/sessions/{session_id}/typing",
            json={"state": "started"},
            headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
            timeout=30,
        ).json()
        print(f"    (typing hint: advisory {hint['state']})")
        time.sleep(0.3)
        messages.append({"role": "user", "content": follow_up})

    time.sleep(0.3)  # the gateway settles the last turn's advisory just after answering
    turns = httpx.get(
        f"{base_url}/v1/sessions/{session_id}/turns",
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {},
        timeout=30,
    ).json()["data"]
    print("recorded turns:")
    for turn in turns:
        advisory = turn["advisory"]
        outcome = f"{advisory['kind']} -> {advisory['outcome']}" if advisory else "none (first turn)"
        tiers = (turn["usage"] or {}).get("cached_tokens_by_tier") or {}
        print(f"    turn {turn['seq']}: worker {turn['worker']}, cached by tier {tiers}, advisory: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
