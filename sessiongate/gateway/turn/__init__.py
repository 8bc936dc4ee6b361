"""One turn's path, from the chat route to the relayed answer: the handler (`chat.py`) and its route, the turn
being served and how it ends (`context.py`), the request's assembly from the stored session, idempotency, implicit
sessions, prefix breaks, bounds and tenant limits, the session's KV calls and turn sharing, and the stream relay."""
