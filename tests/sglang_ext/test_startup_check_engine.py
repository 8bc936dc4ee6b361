"""A server the extension cannot run in stops before it loads anything (real SGLang, CPU, started directly).

The launcher refuses such command lines itself; this is SGLang started another way with the plug-in enabled:
`--tokenizer-worker-num 2` (with which SGLang puts no API-key check on the extension's routes) must stop the server
in its HTTP process, before a scheduler loads the model or pins a host pool.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sessiongate.sglang_ext.launcher import build_command, build_env
from sessiongate.sglang_ext.ports import pick_port
from sessiongate.sglang_ext.worker_config import WorkerConfig

pytestmark = pytest.mark.engine


def test_several_tokenizer_workers_stop_the_server_before_the_model_loads(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = WorkerConfig(
        model_path=tiny_model_dir, state_dir=tmp_path, port=pick_port("127.0.0.1"), storage_backend=None
    )
    # The launcher's command line plus the flag, run as a user would run SGLang: the launcher's own check bypassed.
    command = [*build_command(config), "--tokenizer-worker-num", "2"]
    result = subprocess.run(
        command, env=build_env(config, os.environ), capture_output=True, text=True, timeout=300, check=False
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0
    assert "needs one tokenizer worker, got --tokenizer-worker-num 2" in log
    assert "Load weight" not in log  # no scheduler got that far
    assert "KV Cache is allocated" not in log
