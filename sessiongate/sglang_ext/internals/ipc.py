"""A request/reply channel between SGLang's HTTP process and its scheduler, for the extension.

SGLang 0.5.23's generic RPC (`RpcReqInput`) answers only `success` and a message and takes flat
scalars, so the extension has its own pair of IPC types: `SessiongateCall(op, body)` and
`SessiongateReply(ok, body)`, bodies as JSON text. They are msgspec structs under SGLang's
`BaseReq` (the base its codec knows) and registered with `io_struct.hook_custom_types` in every
process of the worker, so they travel over the same ZMQ sockets as SGLang's own control requests:
the tokenizer manager sends a call to the scheduler, whose request dispatcher hands it to the
extension's handler; the reply goes back through `send_control_output` and the tokenizer
manager's result dispatcher, which resolves the waiting future by the call's `rid`.
"""

from __future__ import annotations

from sglang.srt.managers.io_struct import BaseReq, hook_custom_types

__all__ = ["CallError", "SessiongateCall", "SessiongateReply", "register_types"]


class CallError(Exception):
    """A call the scheduler refuses (unknown prefetch id, unknown op): its `code` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SessiongateCall(BaseReq, kw_only=True):  # type: ignore[misc, call-arg]
    """HTTP process -> scheduler: operation `op` with a JSON `body`; `rid` identifies the call. A context's token
    ids travel as `tokens` and its L3 page hashes as `hashes` (`call_payload`), not in the JSON."""

    op: str
    body: str
    tokens: bytes = b""
    hashes: str = ""


class SessiongateReply(BaseReq, kw_only=True):  # type: ignore[misc, call-arg]
    """Scheduler -> HTTP process: `ok` and a JSON `body`; `rid` is the call's."""

    ok: bool
    body: str


def register_types() -> None:
    """Teach this process's IPC decoder the extension's types (every process that may receive them)."""
    hook_custom_types(SessiongateCall, SessiongateReply)
