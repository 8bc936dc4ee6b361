"""Row ids: unique, unguessable, and in the order they were made (so a new row's key goes at the end of its index)."""

from __future__ import annotations

import re
import time

from sessiongate.sessions._convert import new_id


def test_ids_keep_their_format() -> None:
    assert re.fullmatch(r"turn_[0-9a-f]{24}", new_id("turn_"))


def test_an_id_made_later_sorts_later() -> None:
    earlier = [new_id("turn_") for _ in range(50)]
    time.sleep(0.002)  # the time part counts milliseconds
    later = [new_id("turn_") for _ in range(50)]
    assert max(earlier) < min(later)


def test_ids_made_in_the_same_millisecond_differ() -> None:
    ids = [new_id("adv_") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
