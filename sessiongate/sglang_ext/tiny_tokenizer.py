"""The tokenizer of the tiny test models: a byte-level BPE trained locally, and a ChatML template.

No hub, no download: the BPE is trained with `tokenizers` on a built-in corpus (a fixed seed makes
the same vocabulary every time) and saved as a `PreTrainedTokenizerFast` (`tokenizer.json` +
`tokenizer_config.json`, which carries the chat template and the bos/eos/pad tokens).

The chat template is ChatML (`<|im_start|>role\\n...<|im_end|>\\n`), in the Qwen2.5 style for tools,
so SGLang's `qwen25` tool-call parser (and `sessiongate-json`, which the launcher picks for these
models, see `sglang_ext.plugin`) reads what the model writes:

- a `tools` list goes into the system turn, one JSON object per line inside `<tools>...</tools>`;
- an assistant turn's `tool_calls` are `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- a `tool` message is `<|im_start|>tool\\n<tool_response>\\n...\\n</tool_response><|im_end|>`;
- `add_generation_prompt` opens `<|im_start|>assistant\\n`.

Every special token (and each tool tag) is one token.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TOOL_TAGS",
    "build_tokenizer",
    "chat_template",
]

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = (BOS_TOKEN, PAD_TOKEN, IM_START, EOS_TOKEN)
# Not "special": they must survive decoding (skip_special_tokens) so the tool parser sees them.
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")

_TEMPLATE_HEAD = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set first_is_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if first_is_system -%}{{- render(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}"
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    ' + \'{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif first_is_system -%}"
    "{{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' -}}"
)
_TEMPLATE_TAIL = (
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and first_is_system -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + render(message.content) -}}"
    "{%- for tool_call in message.tool_calls or [] -%}"
    "{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{%- if not loop.first or message.content -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def chat_template(default_system: str | None = None) -> str:
    """The ChatML template above; with `default_system`, a conversation that opens without a system turn
    (and passes no tools) gets that one, as an instruct model's own template does."""
    if default_system is None:
        return _TEMPLATE_HEAD + _TEMPLATE_TAIL
    default = "{%- else -%}{{- '<|im_start|>system\\n' + " + json.dumps(default_system) + " + '<|im_end|>\\n' -}}"
    return _TEMPLATE_HEAD + default + _TEMPLATE_TAIL


CHAT_TEMPLATE = chat_template()

_WORD_TEXT = """\
the a an and or but if then else when while for with without to from of in on at by as is are was
were be been being have has had do does did will would can could should may might must shall not no
yes this that these those it its they them their we our you your he she his her i me my what which
who whom whose where why how all any some each every few many much more most other such only own
same so than too very just also again once here there now today tomorrow yesterday time day week
month year session gateway worker cache prefix prefetch pool storage host device memory token tokens
request reply model agent tool tools call calls function arguments name result results weather city
temperature search query file files read write open close list update delete create user assistant
system message messages content role json string number integer boolean object array null true false
value values key keys error status code data text line lines page pages layer layers head heads
priority schedule router route load queue latency throughput first second third next previous last
please thank thanks hello goodbye sure okay question answer explain summary plan step steps done
"""

_SENTENCES = (
    "The agent asked the gateway to prefetch the session cache before the user finished typing.",
    "A tool call returned, so the next request will reuse the cached prefix on the least loaded worker.",
    "What is the weather in Paris today? Let me check with the weather tool.",
    "Search the files for the word cache and list every line that matches.",
    "The worker moved the prefix from the shared pool to host memory, then to the device.",
    "Hello! How can I help you today? Please explain the plan step by step.",
)


def _corpus(seed: int = 0) -> list[str]:
    """Built-in training text: fixed sentences, chat and tool-call framing, and seeded word salad."""
    rng = random.Random(seed)
    words = _WORD_TEXT.split()
    lines = list(_SENTENCES)
    for role in ("system", "user", "assistant", "tool"):
        lines.append(f"{IM_START}{role}\nYou are a helpful assistant.{EOS_TOKEN}")
    for name in ("get_weather", "search_files", "read_file", "add_numbers", "send_message"):
        arguments = {"city": "Paris", "query": "cache", "path": "/tmp/notes.txt", "a": 3, "b": 4}
        key = rng.choice(sorted(arguments))
        lines.append(f'<tool_call>\n{{"name": "{name}", "arguments": {{"{key}": "{arguments[key]}"}}}}\n</tool_call>')
        lines.append(f'{{"type": "function", "function": {{"name": "{name}", "parameters": {{"type": "object"}}}}}}')
    for _ in range(400):
        words = rng.choices(words, k=rng.randint(4, 14))
        punctuation = rng.choice([".", "?", "!", ",", ":", ";", ""])
        number = rng.randint(0, 10_000)
        lines.append(" ".join(words).capitalize() + punctuation + f" {number}")
    return lines


def build_tokenizer(directory: Path, vocab_size: int) -> None:
    """Train the BPE to exactly `vocab_size` tokens and save it as a PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(  # type: ignore[no-untyped-call]
        vocab_size=vocab_size - len(TOOL_TAGS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    # The model's embedding has exactly vocab_size rows: fill any gap the corpus left with
    # reserved tokens so that every id the model can emit decodes.
    missing = vocab_size - tokenizer.get_vocab_size()
    if missing < 0:
        raise ValueError(f"the trained vocabulary has {tokenizer.get_vocab_size()} tokens, more than {vocab_size}")
    tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])

    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    # The template goes into tokenizer_config.json (not chat_template.jinja), where every reader of
    # a HF tokenizer looks for it; the class is named the way transformers 4 and 5 both load.
    fast.save_pretrained(str(directory), save_jinja_files=False)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
