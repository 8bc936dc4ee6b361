"""Synthetic prompt text whose token count follows a trace: words that are one token each for the model's tokenizer.

Byte-level BPE pre-tokenizes on spaces, so a text of N words that are each a single token (with their leading
space) is N tokens long. The words are drawn at random per session, so two sessions share no prefix beyond their
first few tokens and every cache hit a replay measures is a real cross-turn (or cross-worker) reuse.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SyntheticText"]

# Single tokens (with a leading space) for the tiny models' tokenizer (sglang_ext.tiny_tokenizer, whose training
# is seeded, so the vocabulary is the same everywhere); any word is one token for the fake worker's whitespace count.
_TINY_MODEL_WORDS = ("the", "to", "are", "help", "second", "integer", "false", "today", "cache", "assistant")
# `<|im_start|>user\n ... <|im_end|>\n`: what the ChatML template adds around a message's content.
_CHATML_OVERHEAD = 5


@dataclass(frozen=True, slots=True)
class SyntheticText:
    words: Sequence[str] = _TINY_MODEL_WORDS
    message_overhead_tokens: int = _CHATML_OVERHEAD

    @classmethod
    def for_tokenizer(cls, tokenizer_json: Path, *, message_overhead_tokens: int = _CHATML_OVERHEAD) -> SyntheticText:
        """The alphabetic words of a byte-level BPE vocabulary that are one token with their leading space."""
        vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
        words = sorted(w[1:] for w in vocab if w.startswith("\u0120") and w[1:].isalpha() and w[1:].isascii())
        if len(words) < 4:
            raise ValueError(f"{tokenizer_json}: too few single-token words for synthetic text ({len(words)})")
        return cls(tuple(words), message_overhead_tokens)

    def message(self, tokens: int, rng: random.Random) -> str:
        """Content for a message that should take `tokens` tokens once the chat template wraps it."""
        count = max(tokens - self.message_overhead_tokens, 1)
        return " ".join(rng.choice(self.words) for _ in range(count))
