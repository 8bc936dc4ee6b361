"""Wire formats of the sessiongate extension's HTTP endpoints on a worker.

The gateway imports this module (and nothing else of `sglang_ext`), so it imports nothing of
SGLang or torch: pydantic models and path constants only. Every endpoint lives under
`API_PREFIX`; the worker side (`sglang_ext.plugin`) and the gateway both read the paths from here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["API_PREFIX", "EXTENSION_NAME", "INFO_PATH", "WorkerInfo"]

EXTENSION_NAME = "sessiongate"
API_PREFIX = "/sessiongate/v1"
INFO_PATH = f"{API_PREFIX}/info"


class WorkerInfo(BaseModel):
    """`GET /sessiongate/v1/info`: what the extension and the engine it runs in are."""

    # protected_namespaces=(): the fields named model_* are facts, not pydantic API.
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    extension: str = EXTENSION_NAME
    version: str
    """The sessiongate version the worker runs."""
    sglang_version: str
    cpu_compat: bool
    """True when the worker runs on CPU with sessiongate's compatibility layer."""
    model_path: str
    served_model_name: str
    page_size: int
    hierarchical_cache: bool
    storage_backend: str | None = None
    """SGLang's HiCache L3 backend (`file`, `mooncake`, ...), None without one."""
