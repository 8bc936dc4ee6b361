"""The private parts of third-party libraries sessiongate reads, in one list, each checked on the installed version.

A private attribute of a dependency is a debt: its version is capped in pyproject.toml, and the first test here fails
when an upgrade removes (or renames) one, before anything breaks at run time. The second scans sessiongate's source
for private attributes (`x._name`) of third-party objects and fails on one not in the list, so a new one is registered
here (and looked at) rather than added in passing; an entry no longer read fails it too, so the list stays exact.

SGLang is not in the list: it is pinned to one version (`sglang==0.5.23`) and its internals are all in
`sessiongate/sglang_ext/internals/` (which refuses any other version), so that folder is not scanned.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sessiongate"
# SGLang's own fence (see the module docstring), and the stand-in modules put on a CPU worker's path.
NOT_SCANNED = (SOURCE / "sglang_ext" / "internals", SOURCE / "sglang_ext" / "cpu_compat" / "site")


@dataclass(frozen=True)
class Fenced:
    """`owner` (`module:Class`) has `name` (an attribute, or an instance attribute its methods set); read at `where`."""

    name: str
    owner: str
    where: str
    in_text: bool = False  # read inside code the project runs as text (not seen by the scan)


FENCED = (
    # uvicorn: the server protocol `sessiongate serve` runs on subclasses its httptools protocol (not public API).
    Fenced(
        "HttpToolsProtocol", "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol", "gateway/server_protocol.py"
    ),
    Fenced("connection_made", "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol", "gateway/server_protocol.py"),
    Fenced("loop", "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol", "gateway/server_protocol.py"),
    # Starlette: the chat route's Request reads the body without Request.stream's async generator.
    Fenced("_receive", "starlette.requests:Request", "gateway/turn/route.py"),
    Fenced("_stream_consumed", "starlette.requests:Request", "gateway/turn/route.py"),
    Fenced("_is_disconnected", "starlette.requests:Request", "gateway/turn/route.py"),
    Fenced("_body", "starlette.requests:Request", "gateway/turn/route.py"),
    Fenced("_headers", "starlette.requests:Request", "gateway/turn/route.py"),
    # SQLAlchemy: the store's raw SQLite path compiles a statement once and binds and converts values itself.
    Fenced("_bind_processors", "sqlalchemy.sql.compiler:SQLCompiler", "sessions/_raw.py"),
    Fenced("_result_columns", "sqlalchemy.sql.compiler:SQLCompiler", "sessions/_raw.py"),
    Fenced("_cached_result_processor", "sqlalchemy.sql.type_api:TypeEngine", "sessions/_raw.py"),
    # pydantic-settings: the environment source over a given mapping instead of os.environ.
    Fenced("_load_env_vars", "pydantic_settings:EnvSettingsSource", "settings_base.py"),
    # sglang-router (the `bench` extra, pinned): the benchmarks start its Rust router from a script.
    Fenced("_validate_router_args", "sglang_router.router_args:RouterArgs", "benchmarks/processes.py", in_text=True),
)


def _owner(entry: Fenced) -> type[Any]:
    module_name, _, class_name = entry.owner.partition(":")
    if importlib.util.find_spec(module_name.split(".")[0]) is None:
        pytest.skip(f"{module_name.split('.')[0]} is not installed")
    owner: type[Any] = getattr(importlib.import_module(module_name), class_name)
    return owner


def _has(owner: type[Any], name: str) -> bool:
    """`owner` (or a class it derives from) has `name`: as an attribute, an annotation, or set on `self`."""
    if owner.__name__ == name or hasattr(owner, name):
        return True
    for cls in owner.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if f"self.{name} =" in source or f"self.{name}: " in source:
            return True
    return False


@pytest.mark.parametrize("entry", FENCED, ids=lambda entry: f"{entry.owner}.{entry.name}")
def test_each_fenced_internal_is_still_there(entry: Fenced) -> None:
    assert _has(_owner(entry), entry.name), (
        f"{entry.owner} no longer has {entry.name}, which sessiongate/{entry.where} reads: port it, then update the "
        "version cap in pyproject.toml and this list"
    )


# --- the scan ---------------------------------------------------------------------------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _third_party(root: str) -> bool:
    return root not in ("sessiongate", "__future__") and root not in sys.stdlib_module_names


class _Module:
    """One source file: what it imports from where, and its classes' third-party bases."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.imported: dict[str, str] = {}  # local name -> "module:name" or "module"
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = f"{node.module}:{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported[alias.asname or alias.name.split(".")[0]] = alias.name

    def third_party_bases(self, node: ast.ClassDef) -> list[type[Any]]:
        bases = []
        for base in node.bases:
            base = base.value if isinstance(base, ast.Subscript) else base
            target = self.imported.get(base.id) if isinstance(base, ast.Name) else None
            if target is None or not _third_party(target.split(".")[0].split(":")[0]):
                continue
            module_name, _, name = target.partition(":")
            try:
                bases.append(getattr(importlib.import_module(module_name), name))
            except (ImportError, AttributeError):
                continue  # not installed here: nothing to compare with
        return bases


def _files() -> list[Path]:
    return [path for path in sorted(SOURCE.rglob("*.py")) if not any(path.is_relative_to(d) for d in NOT_SCANNED)]


def _project_names(modules: list[_Module]) -> set[str]:
    """The private names the project defines itself: functions, classes, module and class variables, attributes set
    on its own classes' instances, slots, and keyword arguments."""
    names: set[str] = set()
    for module in modules:
        foreign_classes = {
            id(node)
            for node in ast.walk(module.tree)
            if isinstance(node, ast.ClassDef) and module.third_party_bases(node)
        }
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.arg | ast.keyword) and (node.arg or ""):
                names.add(node.arg or "")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_private(node.value):
                names.add(node.value)  # __slots__, namedtuple fields, getattr names
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef) and id(node) not in foreign_classes:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                        names.add(inner.attr)
    return {name for name in names if _is_private(name)}


def _private_on_self(node: ast.AST) -> str | None:
    """`_x` of `self._x` (or `cls._x`), else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
        return node.attr if _is_private(node.attr) else None
    return None


def _third_party_privates() -> dict[str, set[str]]:
    """Private attribute name -> where sessiongate reads (or overrides) it on a third-party object."""
    modules = [_Module(path) for path in _files()]
    own = _project_names(modules)
    found: dict[str, set[str]] = {}

    def note(name: str, module: _Module, node: ast.AST) -> None:
        where = f"{module.path.relative_to(SOURCE)}:{getattr(node, 'lineno', 0)}"
        found.setdefault(name, set()).add(where)

    for module in modules:
        asked: set[int] = set()  # self._x in a library's subclass: the library is asked, not the project
        for cls in (node for node in ast.walk(module.tree) if isinstance(node, ast.ClassDef)):
            bases = module.third_party_bases(cls)
            if not bases:
                continue
            for node in cls.body:  # an override of a library's private method
                is_method = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                if is_method and _is_private(node.name) and any(_has(base, node.name) for base in bases):
                    note(node.name, module, node)
            for node in ast.walk(cls):
                name = _private_on_self(node)
                if name is not None:
                    asked.add(id(node))
                    if any(_has(base, name) for base in bases):
                        note(name, module, node)
        for node in ast.walk(module.tree):
            private = isinstance(node, ast.Attribute) and _is_private(node.attr) and id(node) not in asked
            if private and node.attr not in own:
                note(node.attr, module, node)  # x._y where nothing of the project defines _y
    return found


def test_every_third_party_private_read_is_fenced() -> None:
    found = _third_party_privates()
    fenced = {entry.name for entry in FENCED if _is_private(entry.name) and not entry.in_text}
    unlisted = {name: sorted(where) for name, where in found.items() if name not in fenced}
    assert not unlisted, f"private attributes of a library, not in FENCED (add them, and cap the version): {unlisted}"
    stale = fenced - set(found)
    assert not stale, f"FENCED lists private attributes no longer read: {sorted(stale)}"


def test_the_scan_finds_a_private_read_and_a_subclass_s(tmp_path: Path) -> None:
    path = tmp_path / "example.py"
    path.write_text(
        "from starlette.requests import Request\n"
        "from sqlalchemy.sql.compiler import SQLCompiler\n\n"
        "class Mine(Request):\n"
        "    def f(self):\n"
        "        self._own = 1\n"
        "        return self._stream_consumed, self._own\n\n"
        "def g(compiled: SQLCompiler):\n"
        "    return compiled._not_defined_here\n"
    )
    module = _Module(path)
    (cls,) = (node for node in module.tree.body if isinstance(node, ast.ClassDef))
    (base,) = module.third_party_bases(cls)
    assert _has(base, "_stream_consumed")
    assert not _has(base, "_own")
    assert "_not_defined_here" not in _project_names([module])
    assert "_own" not in _project_names([module])  # set on a library's subclass: the scan asks the library
