"""An agent loop with real tools, through the sessiongate SDK, that tells the gateway when its next turn is coming.

Two tools: a calculator and a file search over a folder of notes (examples/notes/ by default). For each task the
agent sends the user's message, runs the tools the model calls, posts each result to the gateway
(`session.tool_result`: the gateway then prefetches the session's KV onto the worker the next turn will go to,
while the agent is still busy) and sends the results back to the model. After every turn it prints the worker that
served it, the prompt tokens found in cache per tier, and the advisory settled against the turn: the hint that
foresaw it (typing, tool_call, tool_result, or none) and its outcome (used, late, wasted, missed).

Run it against `sessiongate up` (or `bash scripts/up.sh`):

    python examples/agent_loop.py                          # http://127.0.0.1:8000, or SESSIONGATE_BASE_URL
    python examples/agent_loop.py --base-url http://host:8000 --folder ~/notes --tool-choice auto

SmolLM2-135M (what `sessiongate up` serves) does not pick tools reliably on its own, so by default each task names
the tool to call and the request forces that call (SGLang constrains the output to a well-formed call); with a
larger model pass `--tool-choice auto` and let it choose.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessiongate.sdk import ChatCompletion, Session, SessionGate, Turn

NOTES = Path(__file__).resolve().parent / "notes"
SYSTEM = (
    "You are a helpful assistant with two tools: `calculator` for arithmetic and `search_files` to search the "
    "user's notes. Answer in one short sentence."
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression such as 3 * (4 + 5).",
            "parameters": {
                "type": "object",
                # The pattern keeps a small model's constrained call to arithmetic.
                "properties": {"expression": {"type": "string", "pattern": "^[0-9][0-9+*/() .-]{0,40}$"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Find the lines of the user's notes that contain a word.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "pattern": "^[A-Za-z]{2,24}$"}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
]
# (the user's message, the tool it needs): the tool is forced unless --tool-choice auto.
TASKS = [
    ("Compute 12 * 7 + 3.", "calculator"),
    ("Search my notes for Lisbon.", "search_files"),
]
_OPS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculator(expression: str) -> str:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    result = value(ast.parse(expression, mode="eval").body)
    return json.dumps({"expression": expression, "result": int(result) if result.is_integer() else result})


def search_files(query: str, folder: Path) -> str:
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.suffix in (".md", ".txt")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if query.lower() in line.lower()
    ]
    return json.dumps({"query": query, "matches": hits[:10]})


def run_tool(name: str, arguments: str, folder: Path) -> str:
    try:
        args = json.loads(arguments)
        if name == "calculator":
            return calculator(str(args["expression"]))
        if name == "search_files":
            return search_files(str(args["query"]), folder)
        return json.dumps({"error": f"no tool {name!r}"})
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError) as error:
        return json.dumps({"error": f"{type(error).__name__}: {error}"})


def settled(session: Session, count: int, timeout_s: float = 3.0) -> list[Turn]:
    """The session's turns once the newest one's advisory is settled (the gateway does it just after the turn)."""
    deadline = time.monotonic() + timeout_s
    turns = session.turns()
    while (len(turns) < count or turns[-1].advisory is None) and count > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        turns = session.turns()
    return turns


def report(session: Session, seen: int) -> int:
    """Print the turns recorded since the `seen` first ones; returns how many there are now."""
    turns = settled(session, seen + 1)
    for turn in turns[seen:]:
        tiers = turn.cached_tokens_by_tier
        advisory = f"{turn.advisory.kind} -> {turn.advisory.outcome}" if turn.advisory else "none (first turn)"
        print(
            f"    turn {turn.seq}: worker {turn.worker}, cached device={tiers.device} host={tiers.host} "
            f"pool={tiers.storage}; advisory: {advisory}"
        )
    return len(turns)


def step(session: Session, reply: ChatCompletion, folder: Path) -> list[dict[str, Any]]:
    """Run the tools the reply calls; post each result to the gateway; the tool messages for the model."""
    results = []
    for call in reply.message.tool_calls if reply.message else ():
        output = run_tool(call.function.name, call.function.arguments, folder)
        receipt = session.tool_result(call.id, output)  # the gateway prefetches while we go on
        hint = receipt.advisory.state if receipt.advisory else "waits for the turn's other calls"
        print(f"  tool {call.function.name}({call.function.arguments}) -> {output}")
        print(f"    (result posted: advisory {hint})")
        results.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("SESSIONGATE_BASE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("SESSIONGATE_API_KEY"))
    parser.add_argument("--folder", type=Path, default=NOTES, help="the notes search_files searches")
    parser.add_argument("--tool-choice", choices=["forced", "auto"], default="forced")
    parser.add_argument("--max-steps", type=int, default=3, help="tool rounds per task at most")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    with SessionGate(base_url=args.base_url, api_key=args.api_key, timeout=120) as client:
        session = client.sessions.create(metadata={"example": "agent_loop"})
        session.messages.append({"role": "system", "content": SYSTEM})
        print(f"session {session.id} at {client.base_url}")
        options: dict[str, Any] = {"tools": TOOLS, "max_tokens": args.max_tokens, "temperature": 0}
        seen = 0
        for task, tool in TASKS:
            print(f"\nuser: {task}")
            if seen:
                session.typing("started")  # the user is typing the next task: a hint too
                time.sleep(0.3)
            choice: Any = "auto" if args.tool_choice == "auto" else {"type": "function", "function": {"name": tool}}
            # One call per turn: without it a small model forced to call repeats the call until max_tokens.
            reply = session.chat(
                [{"role": "user", "content": task}], tool_choice=choice, parallel_tool_calls=False, **options
            )
            seen = report(session, seen)
            for _ in range(args.max_steps):
                results = step(session, reply, args.folder)
                if not results:
                    break
                # The model reads the results; it may call a tool again ("auto") or answer.
                reply = session.chat(results, tool_choice="auto", **options)
                seen = report(session, seen)
            print(f"assistant: {reply.content!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
