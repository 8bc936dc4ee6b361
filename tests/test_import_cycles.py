"""No import cycles among the modules of one package: a module's imports (at module level, under
TYPE_CHECKING, or inside a function) never lead back to it. A cycle hidden in a function-level import still
means two modules that cannot be understood, or split, one without the other (sessiongate/gateway/chat.py and
sessiongate/gateway/relay.py were such a pair until the turn's ending moved to sessiongate/gateway/turn.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# sessiongate/sdk/ is not checked yet: sdk._client and sdk._resources import each other (the SDK's
# owner's to untangle).
PACKAGES = ("sessiongate/gateway", "sessiongate/benchmarks", "sessiongate/sessions")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The project modules `path` imports, by full name (a `from package import name` that names a submodule
    counts as importing the submodule, not the package)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(module)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, name, known) for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (a package's `__init__` importing its own modules is not one), or None."""
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return [*trail[trail.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            if node.startswith(target + "."):
                continue  # a module importing its own package's __init__ (re-exports): not a cycle of modules
            found = visit(target, [*trail, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        if found := visit(start, []):
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_within_the_package(package: str) -> None:
    cycle = _cycle(_graph(package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    graph = {
        "pkg.a": _imports(tmp_path / "a.py", "pkg.a", {"pkg.a", "pkg.b"}),
        "pkg.b": _imports(tmp_path / "b.py", "pkg.b", {"pkg.a", "pkg.b"}),
    }
    assert _cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
