"""The CPU layer's `fork_start` patch: SGLang's server process forks its scheduler and detokenizer on a machine
without CUDA, unless other threads run in it by then (the patch is applied to a stand-in of SGLang's engine
module: the real `_set_envs_and_config` installs signal handlers and environment variables in the caller)."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from sessiongate.sglang_ext.internals import patches

pytestmark = pytest.mark.usefixtures("cpu_compat")  # the patch checks the installed SGLang's version


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process as SGLang's server process is when it forks: one thread (pytest-xdist runs one of its own
    in a test process)."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)


@pytest.fixture
def start_method() -> Iterator[None]:
    """The test process's start method, put back afterwards."""
    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def stand_in_engine(calls: list[Any]) -> ModuleType:
    engine = ModuleType(patches.ENGINE_MODULE)

    def _set_envs_and_config(server_args: Any) -> None:
        calls.append(server_args)
        multiprocessing.set_start_method("spawn", force=True)  # what SGLang 0.5.23's does last

    engine._set_envs_and_config = _set_envs_and_config  # type: ignore[attr-defined]
    return engine


def patched(calls: list[Any]) -> ModuleType:
    engine = stand_in_engine(calls)
    (patch,) = patches.cpu_patches()[patches.ENGINE_MODULE]
    patch(engine)
    return engine


@pytest.mark.usefixtures("start_method", "alone")
def test_the_servers_processes_are_forked_after_sglangs_own_setup() -> None:
    calls: list[Any] = []
    engine = patched(calls)
    engine._set_envs_and_config("args")
    assert calls == ["args"]  # SGLang's own setup still runs, first
    assert multiprocessing.get_start_method() == "fork"


@pytest.mark.usefixtures("start_method")
def test_spawn_is_kept_while_other_threads_run() -> None:
    engine = patched([])
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        engine._set_envs_and_config("args")
    finally:
        release.set()
        other.join()
    assert multiprocessing.get_start_method() == "spawn"


@pytest.mark.usefixtures("start_method", "alone")
def test_a_forked_child_loads_the_plug_ins_again() -> None:
    """SGLang loads plug-ins once a process; the flag that says so must not pass from the server to its children,
    or a child never installs sessiongate's scheduler hooks."""
    plugins = importlib.import_module(patches.PLUGINS_MODULE)
    loaded = plugins._plugins_loaded
    plugins._plugins_loaded = True  # the server process has loaded them by the time it forks
    try:
        patched([])._set_envs_and_config("args")
        child = os.fork()
        if child == 0:
            os._exit(0 if plugins._plugins_loaded is False else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert plugins._plugins_loaded is True  # the server's own is left as it was
    finally:
        plugins._plugins_loaded = loaded


def test_the_group_can_be_left_out() -> None:
    assert patches.ENGINE_MODULE not in patches.cpu_patches(disabled={"fork_start"})
