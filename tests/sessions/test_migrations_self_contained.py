"""A committed revision imports nothing of the project: what it does is fixed when it is committed, not changed
later by an edit of the module it imported (0002 imported `sessions.history` until its backfill's definition of
the context digest was copied into it). Alembic, SQLAlchemy and the standard library are what a revision may use."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sessiongate.sessions import history
from sessiongate.sessions.database import MIGRATIONS_DIR

REVISIONS = sorted((MIGRATIONS_DIR / "versions").glob("*.py"))


def _imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, anywhere in it (relative imports as their dots and name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
    return found


def test_there_are_revisions() -> None:
    assert len(REVISIONS) >= 7


@pytest.mark.parametrize("path", REVISIONS, ids=lambda path: path.stem)
def test_a_revision_imports_nothing_of_the_project(path: Path) -> None:
    live = [
        module for module in _imported_modules(path) if module.split(".")[0] == "sessiongate" or module.startswith(".")
    ]
    assert live == [], f"{path.name} imports {live}: copy what it needs into it, as it is now"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_revision_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}, {"type": "image_url", "image_url": "x"}]},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"b": 1, "a": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny \ud800"},
        {"role": "assistant", "content": "sunny"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["empty", "plain", "tools"])
def test_0002s_frozen_digest_is_the_stores_digest_today(messages: list[dict[str, Any]]) -> None:
    """The copy in 0002 computes the digest the store computes now. Should `sessions.history` change its definition
    one day, this fails: the stored digests then need a new revision that recomputes them, not an edit of 0002."""
    reconcile = _load(MIGRATIONS_DIR / "versions" / "0002_reconcile.py")
    assert reconcile._EMPTY_DIGEST == history.EMPTY_DIGEST
    assert reconcile._context_digest(messages) == history.context_digest(messages)
    assert [reconcile._normalise_message(m) for m in messages] == [history.normalise_message(m) for m in messages]
