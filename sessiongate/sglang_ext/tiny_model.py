"""Random-weight Llama models for tests and benchmarks, made locally (no hub, no download).

`make_model(directory, size)` writes a `LlamaForCausalLM` with random weights (fixed seed,
safetensors, `save_pretrained`) plus the locally trained tokenizer of `sglang_ext.tiny_tokenizer`.
It is idempotent: a directory that already holds a complete model is reused as is (a marker file
written last says "complete"), so concurrent test runs and restarts pay the few seconds once.

Sizes:
- `tiny`: hidden 128, 2 layers, 4 heads, 2 KV heads, intermediate 256, vocab 512 - starts fast,
  for functional tests;
- `medium`: hidden 512, 8 layers, 8 heads, 4 KV heads, head_dim 64, intermediate 2048, vocab 1024
  (about 32.5M parameters) - for measurements where recomputing a prefix must cost something.

Run as a module to make one from the command line: `python -m sessiongate.sglang_ext.tiny_model DIR [--size S]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from sessiongate.sglang_ext.tiny_tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, build_tokenizer

__all__ = ["SIZES", "ModelShape", "ModelSize", "is_complete", "main", "make_atomically", "make_model"]

ModelSize = Literal["tiny", "medium"]
SEED = 1234
_COMPLETE_MARKER = ".sessiongate-model-complete"


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 32768


SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(128, 2, 4, 2, 32, 256, 512),
    "medium": ModelShape(512, 8, 8, 4, 64, 2048, 1024),
}


def is_complete(directory: Path) -> bool:
    """Whether `directory` holds a model that sessiongate finished writing (`make_model`, `make_atomically`)."""
    return (directory / _COMPLETE_MARKER).is_file()


def _write_model(directory: Path, shape: ModelShape) -> None:
    """Write config, weights and tokenizer into `directory` (an empty scratch directory)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    build_tokenizer(directory, shape.vocab_size)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)}
    config = LlamaConfig(
        **asdict(shape),
        bos_token_id=token_ids[BOS_TOKEN],
        eos_token_id=token_ids[EOS_TOKEN],
        pad_token_id=token_ids[PAD_TOKEN],
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        dtype="float32",
    )
    # A fork of the global RNG, so that a caller's torch random state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(str(directory), safe_serialization=True)


def make_model(directory: Path | str, size: ModelSize = "tiny") -> Path:
    """Make (or reuse) a random-weight Llama model of `size` in `directory`; return its path."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    return make_atomically(directory, lambda scratch: _write_model(scratch, SIZES[size]), {"size": size, "seed": SEED})


def make_atomically(directory: Path | str, write: Callable[[Path], None], marker: dict[str, object]) -> Path:
    """Make (or reuse) a model directory: `write(scratch)` fills an empty scratch directory, which is then
    renamed to `directory` with a completion marker holding `marker`. A complete directory is reused as is."""
    target = Path(directory).resolve()
    if is_complete(target):
        return target
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists, is not empty and holds no complete model made by sessiongate")
    # transformers imports torchvision, which needs the CPU fixes on a machine without CUDA.
    from sessiongate.sglang_ext.cpu_compat import activate
    from sessiongate.sglang_ext.hardware import has_cuda

    if not has_cuda():
        activate(patch_sglang=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a scratch directory next to the target, then rename: readers (and a concurrent
    # maker) never see a half-written model.
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(scratch)
        scratch.chmod(0o755)  # mkdtemp makes it private; the model is for every local worker.
        (scratch / _COMPLETE_MARKER).write_text(json.dumps(marker) + "\n")
        # Replaces an empty directory; fails if another process put a model there first.
        os.replace(scratch, target)
    except OSError:
        if is_complete(target):
            # Another process finished the same model first: theirs is as good as ours.
            return target
        raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessiongate.sglang_ext.tiny_model",
        description="Make a random-weight Llama model and tokenizer.",
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    print(make_model(args.directory, args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
