"""The layering of docs/architecture.md, checked by a tool: import-linter's contracts (`[tool.importlinter]` in
pyproject.toml) and, on the same import graph (grimp's), no import cycle among the modules of one package.

A module's imports count wherever they are: at module level, under TYPE_CHECKING or inside a function. A cycle hidden
in a function-level import still means two modules that cannot be understood, or split, one without the other
(sessiongate/gateway/turn/chat.py and sessiongate/gateway/turn/relay.py were such a pair until the turn's ending
moved to sessiongate/gateway/turn/context.py). import-linter's own `acyclic_siblings` contract cannot say this: it takes
a subpackage as one node, so two subpackages whose modules import each other's without a cycle among modules count as a
cycle.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Set
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
# sessiongate/sdk/ is not checked yet: sdk._client and sdk._resources import each other (the SDK's
# owner's to untangle).
PACKAGES = ("sessiongate.gateway", "sessiongate.benchmarks", "sessiongate.sessions")


def test_the_import_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _graph(package: str, graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """The imports among `package`'s modules."""
    modules = {package} | graph.find_descendants(package)
    return {module: graph.find_modules_directly_imported_by(module) & modules for module in modules}


def _cycle(imports: Mapping[str, Set[str]]) -> list[str] | None:
    """One import cycle of `imports` (a package's `__init__` importing its own modules is not one), or None."""
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return [*trail[trail.index(node) :], node]
        if node in done:
            return None
        for target in sorted(imports.get(node, ())):
            if node.startswith(target + "."):
                continue  # a module importing its own package's __init__ (re-exports): not a cycle of modules
            found = visit(target, [*trail, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(imports):
        if found := visit(start, []):
            return found
    return None


@pytest.fixture(scope="module")
def project_graph() -> grimp.ImportGraph:
    return grimp.build_graph("sessiongate", cache_dir=None)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_within_the_package(package: str, project_graph: grimp.ImportGraph) -> None:
    cycle = _cycle(_graph(package, project_graph))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_checker_finds_a_cycle_through_a_function_level_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "cyclic_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_pkg", cache_dir=None)
    assert _cycle(_graph("cyclic_pkg", graph)) == ["cyclic_pkg.a", "cyclic_pkg.b", "cyclic_pkg.a"]
