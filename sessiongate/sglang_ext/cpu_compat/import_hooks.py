"""A `sys.meta_path` finder that runs callbacks around the first import of named modules.

This is how the CPU compatibility layer reaches code it must not import eagerly: the hooks are
installed at interpreter start (from `sitecustomize`), cost nothing until a named module is
imported, and then run

- a *before* hook when the module is about to be found (e.g. define op schemas a package's
  import-time code expects), once;
- *after* hooks once the module's code has run, with the module (e.g. replace an attribute).

The finder never loads anything itself: it asks the other finders on `sys.meta_path` for the real
spec and wraps that spec's loader. A module already imported when the hooks are installed gets
its after hooks at once (`ImportHooks.install`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["AfterHook", "BeforeHook", "ImportHooks"]

BeforeHook = Callable[[], None]
AfterHook = Callable[[ModuleType], None]


class _PatchingLoader:
    """Delegates to the real loader, then runs the after hooks on the freshly executed module."""

    def __init__(self, loader: Any, hooks: Sequence[AfterHook]) -> None:
        self._loader = loader
        self._hooks = hooks

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        result: ModuleType | None = self._loader.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for hook in self._hooks:
            hook(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package, get_resource_reader...: the real loader's.
        return getattr(self._loader, name)


class ImportHooks:
    """The meta path finder; build it with the hooks, then `install()` it once per process."""

    def __init__(
        self,
        before: Mapping[str, BeforeHook] | None = None,
        after: Mapping[str, Sequence[AfterHook]] | None = None,
    ) -> None:
        self._before = dict(before or {})
        self._after = {name: tuple(hooks) for name, hooks in (after or {}).items()}
        # Imports can happen from several threads; each hook must run exactly once.
        self._lock = threading.Lock()

    def install(self) -> None:
        """Put the finder first on `sys.meta_path`; modules already imported are patched now."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        for name in list(self._after):
            module = sys.modules.get(name)
            if module is not None:
                for hook in self._take_after(name):
                    hook(module)

    def _take_before(self, name: str) -> BeforeHook | None:
        with self._lock:
            return self._before.pop(name, None)

    def _take_after(self, name: str) -> Sequence[AfterHook]:
        with self._lock:
            return self._after.pop(name, ())

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        before = self._take_before(fullname)
        if before is not None:
            before()
        if fullname not in self._after:
            return None
        spec = self._find_with_other_finders(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        hooks = self._take_after(fullname)
        if hooks:
            spec.loader = _PatchingLoader(spec.loader, hooks)  # type: ignore[assignment]
        return spec

    def _find_with_other_finders(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec: ModuleSpec | None = find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None
