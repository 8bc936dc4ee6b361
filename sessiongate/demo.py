"""The demo conversation: a few turns through a running gateway with the SDK, then what the store recorded.

It shows the point of the project on any stack: which worker served each turn, and how many of each turn's
prompt tokens came from cache (device, host, or the shared pool) instead of being recomputed. With the
generated tiny model the words are random (random weights); the routing and the cache figures are real.
"""

from __future__ import annotations

import httpx

from sdk import SessionGate, Turn

__all__ = ["WEATHER_TOOL", "run_demo"]

SYSTEM = (
    "You are a concise travel assistant. Answer in short sentences and use the tools when the user asks "
    "about the weather."
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Lisbon", "Porto"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _model(base_url: str, api_key: str | None) -> str:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"]
    return str(models[0]["id"]) if models else "default"


def _row(turn: Turn) -> str:
    usage = turn.usage
    prompt = usage.prompt_tokens if usage else None
    cached = usage.cached_tokens if usage else None
    details = (usage.cached_tokens_details if usage else None) or {}
    where = " ".join(f"{k}={v}" for k, v in details.items() if isinstance(v, int) and v)
    timings = turn.timings
    took = ""
    if timings.ended_at and timings.received_at:
        took = f"{(timings.ended_at - timings.received_at).total_seconds() * 1000:.0f} ms"
    return (
        f"  turn {turn.seq}  {turn.status:<9} worker {turn.worker or '-':<16} prompt {prompt!s:>5}  "
        f"cached {cached!s:>5}  {where or '(none)':<28} {took}"
    )


def run_demo(*, base_url: str | None = None, api_key: str | None = None) -> int:
    write = print
    with SessionGate(base_url=base_url, api_key=api_key, timeout=120) as client:
        model = _model(client.base_url, api_key)
        session = client.sessions.create(metadata={"demo": True})
        write(f"session {session.id} (model {model})")
        write(
            "(with the generated tiny model the weights are random, so the words are noise; the routing and the "
            "cache figures below are real)"
        )

        session.messages.append({"role": "system", "content": SYSTEM})
        reply = session.chat(
            [{"role": "user", "content": "I have three days in Lisbon. What should I see first?"}],
            model=model,
            max_tokens=24,
            temperature=0,
        )
        write(f"[1] assistant: {reply.content!r}")

        write("[2] assistant (streamed): ", end="", flush=True)
        stream = session.chat(
            [{"role": "user", "content": "And what should I eat there?"}],
            model=model,
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.delta is not None and chunk.delta.content:
                write(chunk.delta.content, end="", flush=True)
        write("")

        reply = session.chat(
            [{"role": "user", "content": "What is the weather in Lisbon right now?"}],
            model=model,
            max_tokens=64,
            temperature=0,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        calls = reply.choices[0].message.tool_calls
        write(f"[3] assistant calls: {[(c.function.name, c.function.arguments) for c in calls]}")
        for call in calls:
            session.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": '{"city": "Lisbon", "sky": "sunny", "celsius": 24}',
                }
            )
        reply = session.chat([], model=model, max_tokens=24, temperature=0, tools=[WEATHER_TOOL])
        write(f"[4] assistant: {reply.content!r}")

        write("\nWhat the gateway recorded (GET /v1/sessions/{id}/turns):")
        for turn in session.turns():
            write(_row(turn))
    return 0
