"""A structlog processor that keeps secrets and user content out of the logs.

Three rules, applied to every event before it is rendered:
- fields named like a secret (`authorization`, `api_key`, `*_secret`, `password`, ...) are replaced;
- fields that carry user content (`messages`, `content`, `prompt`, `arguments`, ...) are replaced unless the
  gateway runs with `log_content` (a debug setting, off by default);
- in every string value, anything shaped like a key (`sg-...`, `Bearer ...`, a password in a database URL) is
  masked, so a secret that reaches a message or an exception text by accident is caught too.
Ids (`request_id`, `session_id`, `tenant_id`, `turn_id`, key ids and prefixes) are not secrets and stay.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

__all__ = ["Redactor"]

_SECRET_FIELDS = re.compile(r"(^|_)(authorization|api_key|admin_key|secret|password|passwd|token|cookie)$", re.I)
_CONTENT_FIELDS = frozenset(
    {"messages", "content", "prompt", "input_messages", "output_message", "arguments", "result", "text", "body"}
)
_PATTERNS = (
    (re.compile(r"\bsg-[A-Za-z0-9_-]{8,}"), "sg-[redacted]"),
    (re.compile(r"(?i)\bbearer\s+[^\s\"',}]+"), "Bearer [redacted]"),
    (re.compile(r"(://[^:/@\s]+:)[^@\s]+@"), r"\1[redacted]@"),
)
REDACTED = "[redacted]"


class Redactor:
    def __init__(self, *, log_content: bool = False, extra_secrets: tuple[str, ...] = ()) -> None:
        self.log_content = log_content
        # Exact values known to be secret (the admin key, the static key, the salt secret): masked wherever seen.
        self.extra_secrets = tuple(s for s in extra_secrets if len(s) >= 6)

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key in list(event):
            if _SECRET_FIELDS.search(key):
                event[key] = REDACTED
            elif key in _CONTENT_FIELDS and not self.log_content:
                event[key] = "[content redacted]"
            else:
                event[key] = self.scrub(event[key])
        return event

    def scrub(self, value: Any) -> Any:
        """`value` with key-shaped strings and known secrets masked (dicts and lists walked)."""
        if isinstance(value, str):
            for pattern, replacement in _PATTERNS:
                value = pattern.sub(replacement, value)
            for secret in self.extra_secrets:
                value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {k: REDACTED if _SECRET_FIELDS.search(str(k)) else self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value
