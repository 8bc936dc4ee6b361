"""The compact forms in which the HTTP process hands a context to the scheduler, so the scheduler thread parses
nothing large.

A 128k-token context as a JSON list cost the scheduler thread 34 ms to parse (`json.loads` and an `array` built
from the list), and its L3 page hashes 55 ms to compute, on the 2-core development machine. The HTTP process (its
own process, off the scheduler's thread) now does both: the token ids travel as the raw bytes of an `array("q")`
(`pack_tokens`; the scheduler's `unpack_tokens` is one copy), the page hashes as one space-separated string
(`pack_hashes` / `unpack_hashes`, one `str.split`), in `ipc.SessiongateCall`'s `tokens` and `hashes` fields beside
the small JSON body. `benchmarks.scheduler_thread` measures each form.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["pack_hashes", "pack_tokens", "unpack_hashes", "unpack_tokens"]

TOKEN_TYPECODE = "q"
"""The tree's own key type (`RadixKey` over `array("q")`): what the scheduler keys on, with no conversion."""


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    tokens = token_ids if isinstance(token_ids, array) and token_ids.typecode == TOKEN_TYPECODE else None
    return (tokens if tokens is not None else array(TOKEN_TYPECODE, token_ids)).tobytes()


def unpack_tokens(data: bytes) -> array[int]:
    tokens = array(TOKEN_TYPECODE)
    tokens.frombytes(data)
    return tokens


def pack_hashes(hashes: Sequence[str]) -> str:
    return " ".join(hashes)


def unpack_hashes(text: str) -> list[str]:
    return text.split()
