"""The CPU layer's site directory as a worker process sees it: sitecustomize and the sgl_kernel stand-in."""

from __future__ import annotations

import os
import subprocess
import sys

from sessiongate.sglang_ext.cpu_compat import DISABLE_ENV, SITE_DIR

PROBE = """
import importlib, json, sys
import sessiongate.sglang_ext.cpu_compat as compat
import sgl_kernel
from sgl_kernel import copy_all_layer_kv_cache_cpu
facts = {"hooks": compat.active_hooks() is not None, "torch_loaded": "torch" in sys.modules,
         "stand_in": getattr(sgl_kernel, "STAND_IN", False)}
try:
    copy_all_layer_kv_cache_cpu(1, 2)
except NotImplementedError as error:
    facts["call"] = str(error)
try:
    from sgl_kernel.scalar_type import scalar_types
except ImportError:
    facts["submodule"] = "ImportError"
try:
    from sgl_kernel import fused_add_rmsnorm
except ImportError:
    facts["other_name"] = "ImportError"
print(json.dumps(facts))
"""


def run_probe(extra_env: dict[str, str] | None = None) -> dict[str, object]:
    import json

    env = dict(os.environ, PYTHONPATH=str(SITE_DIR), **(extra_env or {}))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_site_dir_installs_hooks_lazily_and_a_stand_in_sgl_kernel() -> None:
    facts = run_probe()
    assert facts["hooks"] is True
    assert facts["torch_loaded"] is False  # hooks only: nothing heavy at interpreter start
    assert facts["stand_in"] is True
    assert "copy_all_layer_kv_cache_cpu" in str(facts["call"])
    # Names SGLang imports under `try/except ImportError` must stay missing, so its fallbacks run.
    assert facts["submodule"] == "ImportError"
    assert facts["other_name"] == "ImportError"


def test_unknown_disabled_patch_group_fails_loudly() -> None:
    env = dict(os.environ, PYTHONPATH=str(SITE_DIR), **{DISABLE_ENV: "nonsense"})
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, check=False)
    assert "unknown CPU patch group" in done.stderr
