"""The stream assembler's shortcut for the usual chunk (one choice, a text delta) assembles what the general steps
assemble, on every shape of chunk a worker may send."""

from __future__ import annotations

import itertools
import random
from typing import Any

from sessiongate.gateway.turn.assembly import StreamAssembler, cache_details


class _GeneralAssembler(StreamAssembler):
    """Every chunk through the general steps (the assembler before its shortcut)."""

    def add(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        self.model = chunk.get("model") or self.model
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        self.cached_tokens_details = cache_details(chunk) or self.cached_tokens_details
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._add_delta(delta)


_CONTENTS = [None, "", " tok", 7, ["x"]]
_REASONING = [None, "", "think", 3]
_TOOL_CALLS = [
    None,
    [],
    [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"q"'}}],
    [{"index": 0, "function": {"arguments": ': "x"}'}}],
    ["not a call"],
]


def _chunk(rng: random.Random) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for key, values in (("content", _CONTENTS), ("reasoning_content", _REASONING), ("tool_calls", _TOOL_CALLS)):
        if rng.random() < 0.8:
            delta[key] = rng.choice(values)
    choice: dict[str, Any] = {"index": rng.choice([0, 0, 0, 1]), "delta": rng.choice([delta, delta, None, "x"])}
    choice["finish_reason"] = rng.choice([None, None, "stop", "tool_calls", ""])
    chunk: dict[str, Any] = {"choices": rng.choice([[choice], [choice], [], None, [choice, "junk"]])}
    if rng.random() < 0.7:
        chunk["model"] = rng.choice([None, "", "m1", "m2"])
    if rng.random() < 0.2:
        chunk["usage"] = rng.choice([None, {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, 1])
    if rng.random() < 0.2:
        chunk["sglext"] = rng.choice([None, {"cached_tokens_details": {"device": 1, "host": 0}}, {"x": 1}])
    return chunk


def _state(assembler: StreamAssembler) -> tuple[Any, ...]:
    return (
        assembler.result(),
        assembler.chunks,
        assembler.generated_chunks,
        assembler.tokens_used({"messages": [{"role": "user", "content": "hello"}]}),
    )


def test_the_shortcut_assembles_what_the_general_steps_assemble() -> None:
    rng = random.Random(20261126)
    for _ in range(2000):
        chunks = [_chunk(rng) for _ in range(rng.randint(1, 8))]
        fast, general = StreamAssembler(), _GeneralAssembler()
        for chunk in chunks:
            fast.add(chunk)
            general.add(chunk)
        assert _state(fast) == _state(general), chunks


def test_a_usual_text_stream_assembles_its_message() -> None:
    assembler = StreamAssembler()
    words = ["Hel", "lo", "", " world"]
    for word, last in zip(words, itertools.chain([False] * 3, [True]), strict=True):
        choice = {"index": 0, "delta": {"role": None, "content": word, "reasoning_content": None, "tool_calls": None}}
        choice["finish_reason"] = "stop" if last else None
        assembler.add({"model": "m", "choices": [choice], "usage": None})
    assembler.add({"model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})
    result = assembler.result()
    assert result.message == {"role": "assistant", "content": "Hello world"}
    assert (result.finish_reason, result.model, assembler.generated_chunks) == ("stop", "m", 3)
