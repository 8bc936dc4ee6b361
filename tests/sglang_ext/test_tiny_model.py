"""The tiny random-weight model: files, determinism, tokenizer, and the chat template with tools."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sessiongate.sglang_ext.tiny_model import SIZES, is_complete, make_model
from sessiongate.sglang_ext.tiny_tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TOOL_TAGS

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_model_files_and_config(tiny_model_dir: Path) -> None:
    assert is_complete(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    shape = SIZES["tiny"]
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (128, 2, 512)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["intermediate_size"] == shape.intermediate_size
    assert (tiny_model_dir / "model.safetensors").is_file()
    tokenizer_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"], tokenizer_config["pad_token"]) == (
        BOS_TOKEN,
        EOS_TOKEN,
        PAD_TOKEN,
    )


def test_special_tokens_are_single_tokens(tokenizer: Any) -> None:
    assert len(tokenizer) == SIZES["tiny"].vocab_size
    for token in (*SPECIAL_TOKENS, *TOOL_TAGS):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
        assert tokenizer.decode(ids) == token
    config = json.loads((Path(tokenizer.name_or_path) / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert config["bos_token_id"] == tokenizer.convert_tokens_to_ids(BOS_TOKEN)
    assert config["pad_token_id"] == tokenizer.convert_tokens_to_ids(PAD_TOKEN)


def test_text_round_trips(tokenizer: Any) -> None:
    text = 'The agent asked: what is the weather in Paris today? Ünïcödé 42 {"city": "Paris"}'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_roles_and_generation_prompt(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": [{"type": "text", "text": "More"}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nMore<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without_prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=False)
    assert without_prompt.endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_chat_template_renders_tools_tool_calls_and_tool_results(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "18C"},
        {"role": "tool", "tool_call_id": "b", "content": "25C"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True)
    system, rest = rendered.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools>" in system
    assert rest == (
        "<|im_start|>user\nWeather in Paris and Tokyo?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n25C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Tool tags and chat markers stay single tokens inside a rendered conversation.
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(tokenizer.convert_tokens_to_ids("<tool_call>")) == 4  # 2 in the instructions, 2 calls
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 6


def test_make_model_is_idempotent_and_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    def digest(directory: Path) -> dict[str, str]:
        return {
            name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json")
        }

    before = digest(tiny_model_dir)
    marker = tiny_model_dir / ".sessiongate-model-complete"
    written = marker.stat().st_mtime_ns
    assert make_model(tiny_model_dir, "tiny") == tiny_model_dir
    assert marker.stat().st_mtime_ns == written  # reused, not rewritten
    again = make_model(tmp_path / "again", "tiny")
    assert digest(again) == before


def test_make_model_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        make_model(tmp_path, "tiny")
    with pytest.raises(ValueError, match="unknown model size"):
        make_model(tmp_path / "x", "huge")  # type: ignore[arg-type]
