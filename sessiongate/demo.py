"""The demo conversation: a few turns through a running gateway with the SDK, sending the signals that let the
gateway prefetch each turn's KV, then the table of what the store recorded.

Before each user turn the demo says the user is typing (`session.typing("started")`), and after the model's tool
call it posts the tool's result (`session.tool_result(...)`): each is an advisory hint, on which the gateway asks
the worker the next turn will go to to bring the session's KV to its device before the turn arrives. The table
shows per turn the worker that served it, how many prompt tokens came from cache in each tier (device, host
memory, the shared pool), and the advisory settled against the turn: its signal (kind) and outcome (used: the
turn found the prefetched KV there; late: it arrived before the prefetch finished; wasted; missed: no hint).
With the generated tiny model the words are random (random weights); the routing and the cache figures are real.
"""

from __future__ import annotations

import ast
import json
import operator
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sessiongate.sdk import ChatCompletion, Function, Session, SessionGate, ToolCall, Turn

__all__ = ["CALCULATOR_TOOL", "WEATHER_TOOL", "calculate", "run_demo", "settled_turns", "turn_table"]

SYSTEM = "You are a concise assistant. Answer in one or two short sentences. Use the calculator for arithmetic."
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 3 * (4 + 5).",
        "parameters": {
            "type": "object",
            # The pattern keeps a small model's constrained call to arithmetic (SGLang enforces the schema).
            "properties": {"expression": {"type": "string", "pattern": "^[0-9][0-9+*/() .-]{0,40}$"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}
# A forced call of it is the engine tests' tool-call turn (an enum argument: the same call every time).
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
# How long the demo's "user" reads the answer before typing, and types before sending (the prefetch the typing
# hint started runs meanwhile). A hint sent the instant a turn ends can find the shared pool still without that
# turn's pages (the worker writes them through in the background): the prefetch then brings nothing.
READING_S = 1.0
TYPING_S = 0.5

_OPERATORS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / and parentheses only; never `eval`)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    return value(ast.parse(expression, mode="eval").body)


def _run_calculator(arguments: str) -> str:
    try:
        expression = str(json.loads(arguments)["expression"])
        result = calculate(expression)
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError) as error:
        return json.dumps({"error": str(error)})
    return json.dumps({"expression": expression, "result": int(result) if result.is_integer() else result})


def _model(base_url: str, api_key: str | None) -> str:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"]
    return str(models[0]["id"]) if models else "default"


def _hint(session: Session, write: Callable[..., None]) -> None:
    time.sleep(READING_S)
    signal = session.typing("started")
    why = f" ({signal.reason})" if signal.reason else ""
    write(f"    (typing hint: advisory {signal.state}{why}, prefetch on {signal.worker or '-'})")
    time.sleep(TYPING_S)


def settled_turns(session: Session, timeout_s: float = 3.0) -> list[Turn]:
    """The session's turns once the last one's advisory is settled (the gateway settles it just after the turn)."""
    deadline = time.monotonic() + timeout_s
    turns = session.turns()
    while len(turns) > 1 and turns[-1].advisory is None and time.monotonic() < deadline:
        time.sleep(0.05)
        turns = session.turns()
    return turns


def turn_table(turns: list[Turn]) -> list[str]:
    """Per turn: status, worker, prompt and cached tokens by tier, the advisory's signal and outcome, duration."""
    lines = [
        f"  {'turn':<4} {'status':<7} {'worker':<16} {'prompt':>6} {'device':>6} {'host':>5} {'pool':>5}  "
        f"{'advisory':<12} {'outcome':<9} {'took':>7}"
    ]
    for turn in turns:
        tiers = turn.cached_tokens_by_tier
        prompt = turn.usage.prompt_tokens if turn.usage else 0
        advisory = turn.advisory
        took = ""
        if turn.timings.ended_at and turn.timings.received_at:
            took = f"{(turn.timings.ended_at - turn.timings.received_at).total_seconds() * 1000:.0f} ms"
        lines.append(
            f"  {turn.seq:<4} {turn.status:<7} {turn.worker or '-':<16} {prompt:>6} {tiers.device:>6} "
            f"{tiers.host:>5} {tiers.storage:>5}  {advisory.kind if advisory else '-':<12} "
            f"{advisory.outcome if advisory else '-':<9} {took:>7}"
        )
    return lines


def run_demo(*, base_url: str | None = None, api_key: str | None = None) -> int:
    write = print
    with SessionGate(base_url=base_url, api_key=api_key, timeout=120) as client:
        model = _model(client.base_url, api_key)
        session = client.sessions.create(metadata={"demo": True})
        write(f"session {session.id} (model {model})")
        if Path(model).name in ("tiny", "medium"):
            write(
                "(with the generated tiny and medium models the weights are random, so the words are noise; the "
                "routing and the cache figures below are real)"
            )
        # The tool is offered on every turn: it is rendered into the prompt's system part, so every turn's prompt
        # extends the one before and finds its KV cached (offering it on one turn only would change the prefix).
        options: dict[str, Any] = {"model": model, "max_tokens": 24, "temperature": 0, "tools": [CALCULATOR_TOOL]}

        session.messages.append({"role": "system", "content": SYSTEM})
        reply = session.chat([{"role": "user", "content": "What is the capital of Portugal?"}], **options)
        write(f"[1] assistant: {reply.content!r}")

        _hint(session, write)
        write("[2] assistant (streamed): ", end="", flush=True)
        stream = session.chat([{"role": "user", "content": "Name one famous dish from there."}], stream=True, **options)
        for chunk in stream:
            write(chunk.content, end="", flush=True)
        write("")

        _hint(session, write)
        # A forced tool choice: SGLang constrains the answer to a call of the calculator, which a 135M model would
        # not reliably make unforced (a larger model can be left on "auto").
        reply = session.chat(
            [{"role": "user", "content": "Compute 12 * 7 + 3."}],
            tool_choice={"type": "function", "function": {"name": "calculator"}},
            parallel_tool_calls=False,  # else a small model forced to call repeats the call until max_tokens
            **{**options, "max_tokens": 48},
        )
        _tool_turn(session, reply, write, options)

        write("\nWhat the gateway recorded (GET /v1/sessions/{id}/turns):")
        for line in turn_table(settled_turns(session)):
            write(line)
        write(
            "  (device/host/pool: prompt tokens whose KV came from the worker's device memory, its host memory or the "
            "shared pool; advisory: the hint that foresaw the turn, or none)"
        )
    return 0


def _tool_turn(session: Session, reply: ChatCompletion, write: Callable[..., None], options: dict[str, Any]) -> None:
    calls = reply.message.tool_calls if reply.message else ()
    write(f"[3] assistant calls: {[(c.function.name, c.function.arguments) for c in calls]}")
    if not calls:
        # SmolLM2-135M sometimes writes the call as text the tool-call parser cannot read (several calls, or cut
        # off). Then the demo supplies the call itself in the history: the gateway has no record of a call the
        # model never made, so the hint that the tool returned goes as an explicit one of kind tool_result.
        call = ToolCall("call_demo_1", "function", Function("calculator", json.dumps({"expression": "12 * 7 + 3"})))
        session.messages[-1] = {"role": "assistant", "content": None, "tool_calls": [call.to_dict()]}
        result = _run_calculator(call.function.arguments)
        hint = session.advise(kind="tool_result")
        write(f"    (no parseable call: the demo supplies it) calculator = {result}  (hint: advisory {hint.state})")
        session.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    for call in calls:
        result = _run_calculator(call.function.arguments)
        receipt = session.tool_result(call.id, result)  # the hint: the next turn comes as soon as this is in
        state = receipt.advisory.state if receipt.advisory else "waiting for the turn's other calls"
        write(f"    calculator({call.function.arguments}) = {result}  (tool result posted: advisory {state})")
        session.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    time.sleep(TYPING_S / 2)
    reply = session.chat([], **options)
    write(f"[4] assistant: {reply.content!r}")
