"""The OpenAI Agents SDK (`openai-agents`) against sessiongate's Responses API: a response chain is a session.

The Agents SDK talks to `/v1/responses` through the official `openai` client, unchanged: the example sets only the
base URL. Each run continues the previous one with `previous_response_id`, so the gateway builds each prompt from
the turns it stored (the agent sends only what is new) and every model call of the chain is a turn of one session,
routed with its KV cache in mind: from the second turn on, the shared prefix is found in the worker's cache. The
second run is streamed (`Runner.run_streamed`); the third hands over to an agent with a calculator tool that the
model must call (SmolLM2 does not choose tools by itself), whose result is the run's answer. Then the example prints
what the gateway recorded for the session: per turn the worker, the prompt tokens and those found in cache.

Needs the `examples` extra (`pip install -e .[examples]`, which scripts/setup.sh installs: `openai-agents`).
Run it against `sessiongate up` (or `bash scripts/up.sh`):

    python examples/agents_sdk.py                         # http://127.0.0.1:8000, or SESSIONGATE_BASE_URL
    python examples/agents_sdk.py --base-url http://host:8000
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIResponsesModel,
    RunContextWrapper,
    Runner,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

# One set of instructions for every agent of the chain: a changed system prompt would change the prompt's prefix.
# Workers cache KV in whole pages (64 tokens on the CPU workers), so it is a few pages long.
INSTRUCTIONS = (
    "You are the assistant of a travel planning app. The user is planning a trip through Europe and asks short "
    "questions about countries, their capitals, languages and currencies, and sometimes asks for a small sum about "
    "the budget. Answer every question in one short, factual sentence, without lists, without greetings and without "
    "repeating the question. Use the calculator tool for every computation instead of doing arithmetic yourself. "
    "If you do not know an answer, say so in one sentence instead of guessing. Never invent facts about places, "
    "prices or timetables."
)
_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> float:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only numbers and + - * / ( )")

    return value(ast.parse(expression, mode="eval").body)


async def run_calculator(context: RunContextWrapper[Any], arguments: str) -> str:
    expression = str(json.loads(arguments or "{}").get("expression", ""))
    try:
        result = calculate(expression)
        output: dict[str, Any] = {"expression": expression, "result": int(result) if result.is_integer() else result}
    except (ValueError, SyntaxError, ZeroDivisionError) as error:
        output = {"expression": expression, "error": str(error)}
    return json.dumps(output)


CALCULATOR = FunctionTool(
    name="calculator",
    description="Evaluate an arithmetic expression such as 3 * (4 + 5).",
    params_json_schema={
        "type": "object",
        # Arithmetic only, and short: a small model's constrained call otherwise rambles on.
        "properties": {"expression": {"type": "string", "pattern": "^[0-9][0-9+*/() .-]{0,20}$"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    on_invoke_tool=run_calculator,
    strict_json_schema=False,
)


async def main_async(args: argparse.Namespace) -> int:
    base_url = args.base_url.rstrip("/")
    auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    set_tracing_disabled(True)  # the SDK's traces go to OpenAI's platform, which a local gateway is not
    client = AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key=args.api_key or ""
    )  # empty: no key sent (`sessiongate up` needs none)
    async with httpx.AsyncClient(base_url=base_url, headers=auth, timeout=60) as http:
        model_id = (await http.get("/v1/models")).json()["data"][0]["id"]
        model = OpenAIResponsesModel(model=model_id, openai_client=client)
        settings = ModelSettings(temperature=0, max_tokens=args.max_tokens)
        guide = Agent(name="guide", instructions=INSTRUCTIONS, model=model, model_settings=settings)
        # The call is forced (SGLang constrains the output to it), and its result ends the run.
        accountant = Agent(
            name="accountant",
            instructions=INSTRUCTIONS,
            model=model,
            tools=[CALCULATOR],
            model_settings=ModelSettings(
                temperature=0, max_tokens=2 * args.max_tokens, tool_choice="calculator", parallel_tool_calls=False
            ),
            tool_use_behavior="stop_on_first_tool",
        )

        first = await Runner.run(guide, "What is the capital of France?")
        print(f"[1] {first.final_output!r}  (response {first.last_response_id})")
        second = Runner.run_streamed(guide, "And of Italy?", previous_response_id=first.last_response_id)
        deltas = 0
        async for event in second.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas += 1
        print(f"[2] {second.final_output!r}  (streamed in {deltas} deltas, response {second.last_response_id})")
        third = await Runner.run(
            accountant,
            "The hotel costs 85 a night for 3 nights: compute 85 * 3.",
            previous_response_id=second.last_response_id,
        )
        print(f"[3] calculator -> {third.final_output}  (response {third.last_response_id})")

        stored = (await http.get(f"/v1/responses/{third.last_response_id}")).json()
        session_id = stored["sessiongate"]["session_id"]  # the session the chain is
        turns = (await http.get(f"/v1/sessions/{session_id}/turns")).json()["data"]
        print(f"session {session_id}: {len(turns)} turns")
        for turn in turns:
            usage = turn.get("usage") or {}
            print(
                f"    turn {turn['seq']}: {turn['status']} on {turn['worker']}, prompt tokens "
                f"{usage.get('prompt_tokens')}, cached {usage.get('cached_tokens')}, "
                f"context_reset {turn['context_reset']}"
            )
    await client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--max-tokens", type=int, default=24)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
