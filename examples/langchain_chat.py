"""LangChain's `ChatOpenAI` against sessiongate: a conversation with a tool call, recorded as one session.

`ChatOpenAI` talks to the gateway's OpenAI-compatible API; the only sessiongate-specific piece is the
`X-Session-Id` default header that names the session. The example asks a question, has the model call a
calculator (bound with `bind_tools`), runs it, posts the tool's result to the gateway too (a hint that the next turn
follows: the gateway prefetches the session's KV while LangChain builds the next request) and sends the result back
to the model. Then it prints what the gateway recorded per turn: worker, cached tokens by tier, advisory outcome.

Needs the `examples` extra (`pip install -e .[examples]`, which scripts/setup.sh installs: `langchain-openai`).
Run it against `sessiongate up` (or `bash scripts/up.sh`):

    python examples/langchain_chat.py                     # http://127.0.0.1:8000, or SESSIONGATE_BASE_URL
    python examples/langchain_chat.py --base-url http://host:8000
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from sessiongate.sdk import SessionGate

SYSTEM = (
    "You are the assistant of a small shop. You help the owner with prices, stock and simple sums, and you use the "
    "calculator tool for every computation instead of doing arithmetic yourself. Answer in one short sentence, "
    "without greetings, lists or code, and never invent prices or quantities that the owner did not give you."
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 3 * (4 + 5).",
        "parameters": {
            "type": "object",
            # Arithmetic only, and short: a small model's constrained call otherwise rambles on.
            "properties": {"expression": {"type": "string", "pattern": "^[0-9][0-9+*/() .-]{0,20}$"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    base_url = args.base_url.rstrip("/")
    session_id = f"langchain-example-{uuid.uuid4().hex[:8]}"

    gateway = SessionGate(base_url=base_url, api_key=args.api_key)
    auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = httpx.get(f"{base_url}/v1/models", headers=auth, timeout=30).json()["data"][0]["id"]
    llm = ChatOpenAI(
        model=model,
        base_url=f"{base_url}/v1",
        api_key=args.api_key or "",  # type: ignore[arg-type]  # empty: no key sent (`sessiongate up` needs none)
        default_headers={"X-Session-Id": session_id},
        max_tokens=args.max_tokens,  # type: ignore[call-arg]
        temperature=0,
    )
    print(f"session {session_id}, model {model}")
    # A small model does not choose tools reliably: the call is forced (SGLang constrains the output to it), one
    # call per turn. A larger model can be bound with tool_choice="auto".
    with_calculator = llm.bind_tools([CALCULATOR], tool_choice="calculator", parallel_tool_calls=False)

    history: list[BaseMessage] = [SystemMessage(SYSTEM), HumanMessage("I have 12 boxes of 7 apples: compute 12 * 7.")]
    reply = with_calculator.invoke(history)
    assert isinstance(reply, AIMessage)
    history.append(reply)
    print(f"[1] assistant calls: {[(c['name'], c['args']) for c in reply.tool_calls]}")
    for call in reply.tool_calls:
        expression = str(call["args"].get("expression", ""))
        try:
            result = calculate(expression)
            output: dict[str, Any] = {
                "expression": expression,
                "result": int(result) if result.is_integer() else result,
            }
        except (ValueError, SyntaxError, ZeroDivisionError) as error:
            output = {"error": str(error)}
        content = json.dumps(output)
        receipt = gateway.sessions.tool_result(session_id, str(call["id"]), content)
        state = receipt.advisory.state if receipt.advisory else "waiting"
        print(f"    calculator({expression}) = {content}  (tool result posted: advisory {state})")
        history.append(ToolMessage(content, tool_call_id=str(call["id"])))

    # The prompt must render the tools as the first turn did, or its prefix (and so its cached KV) would differ.
    answer = llm.bind_tools([CALCULATOR]).invoke(history)
    print(f"[2] assistant: {answer.content!r}")

    time.sleep(0.3)  # the gateway settles the last turn's advisory just after answering
    for turn in gateway.sessions.turns(session_id):
        tiers = turn.cached_tokens_by_tier
        advisory = f"{turn.advisory.kind} -> {turn.advisory.outcome}" if turn.advisory else "none (first turn)"
        print(
            f"    turn {turn.seq}: worker {turn.worker}, cached device={tiers.device} host={tiers.host} "
            f"pool={tiers.storage}; advisory: {advisory}"
        )
    gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
