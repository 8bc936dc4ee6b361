"""What the applications asked about their KV, as the order in which the radix cache gives pages up.

SGLang evicts radix-tree leaves in the order of its eviction strategy's key (smallest first).
`KVFate` holds what sessiongate adds to that order and `eviction_rank` folds it into one key
prefix, read by the strategy the scheduler installs (`internals.kv_ops`). This is SYMPHONY's
priority-based KV memory: a page's rank comes from what the gateway knows of its session.

1. pages being dropped (`doomed`, only for the duration of one drop) go before anything else;
2. then by effective priority, the lowest first:
   - a node's own priority (SGLang sets it from the request that filled it, raising only);
   - raised by a `retain` (`hold`) until its deadline, then back to its own;
   - a prefetched page nobody has used yet has the prefetch's priority until the prefetch's
     ttl passes, then the lowest priority of all (`LOWEST_PRIORITY`): a wrong hint decays;
3. within one priority, pages no live hint expects (an idle session whose user is reading) before
   pages a live hint does (an unused prefetch within its ttl, a retain before its deadline);
4. among hinted pages, the one whose request is expected last goes first (Belady's rule on what
   the hints say: a prefetch's `expected_in`, at once when the gateway gave none; a retain's
   deadline). With many live hints and little memory, the hint whose turn is about to come keeps
   its pages; when it went the other way (the hint that ends soonest first), the oldest hints, whose
   turns were the next to arrive, were evicted by the newer ones (docs/prefetch.md);
5. then SGLang's own key (LRU, or priority + LRU).

A prefetch may evict what ranks below it (`ranks_below`): an advisory's pages displace pages of
a lower priority, unhinted pages of its own, and live hints of its own priority expected after it.

"Used" is read from the node's `last_access_time`, which SGLang bumps whenever a request's
prefix match or insert walks through the node: a node touched after the prefetch settled has
served (or is serving) a request. Nothing here pins anything: a raised or fresh page is still
evicted when everything ranked before it is gone.

Nodes are held weakly: a node the tree deletes is forgotten with it. Only the scheduler thread
touches a `KVFate`; `sweep` (from the scheduler's per-iteration tick) forgets marks that no
longer change the order, so the tables stay as small as the live marks.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LOWEST_PRIORITY", "KVFate", "PrefetchMark", "TreeNodeLike"]

LOWEST_PRIORITY = -sys.maxsize
"""Below any request priority: SGLang's own root node sits here."""


class TreeNodeLike(Protocol):
    """What is read of a radix-tree node (SGLang's `UnifiedTreeNode` has these attributes)."""

    priority: int
    last_access_time: float


@dataclass(frozen=True)
class PrefetchMark:
    """What a prefetch marked a node with (`mark_prefetched` returns them, for `end_hint`)."""

    priority: int
    fresh_until: float
    settled_access: float
    """The node's `last_access_time` when the prefetch settled: any later access is a use."""
    expected_at: float
    """When the request the prefetch is for is expected."""
    brought: bool
    """The prefetch brought it (past the ttl unused, a wrong hint's page: the lowest priority); False: it was
    already there (past the ttl, back to its own)."""


@dataclass(frozen=True)
class _Hold:
    priority: int
    until: float


class KVFate:
    """Per-node marks: prefetched-unused, retained, being dropped (scheduler thread only)."""

    def __init__(self) -> None:
        self._prefetched: weakref.WeakKeyDictionary[TreeNodeLike, PrefetchMark] = weakref.WeakKeyDictionary()
        self._held: weakref.WeakKeyDictionary[TreeNodeLike, _Hold] = weakref.WeakKeyDictionary()
        self._doomed: weakref.WeakSet[TreeNodeLike] = weakref.WeakSet()
        # `id`s of every node that may have a mark (a superset: rebuilt by `sweep`), so that ranking an unmarked
        # node, what nearly every node of an eviction's heap is, costs one set look-up (`might_be_marked`).
        self._maybe_marked: set[int] = set()

    # --- marks ---------------------------------------------------------------------------------

    def mark_prefetched(
        self,
        nodes: Iterable[TreeNodeLike],
        priority: int,
        ttl_s: float,
        now: float,
        *,
        expected_at: float | None = None,
        brought: bool = True,
    ) -> list[tuple[TreeNodeLike, PrefetchMark]]:
        """Nodes of a prefetch's context, for a request expected at `expected_at` (None: now): those it
        brought in, or (`brought=False`) those already there. A hint for a session whose KV is still on
        the worker that served its last turn (the commonest hint) must protect those pages as much as
        pages it loads: unmarked, they ranked as any idle session's and went before every other hint's.

        Each also takes the prefetch's priority as its own (raising only, as an insert does): the
        host insert that brought it gave it its parent's, which for a node under the root is the
        root's `LOWEST_PRIORITY`, and it keeps its own once a request has used it.
        """
        marks: list[tuple[TreeNodeLike, PrefetchMark]] = []
        expected = now if expected_at is None else expected_at
        for node in nodes:
            node.priority = max(int(node.priority), priority)
            mark = PrefetchMark(priority, now + ttl_s, node.last_access_time, expected, brought)
            self._prefetched[node] = mark
            self._maybe_marked.add(id(node))
            marks.append((node, mark))
        return marks

    def end_hint(self, marks: Iterable[tuple[TreeNodeLike, PrefetchMark]], now: float) -> None:
        """The hint these marks (`mark_prefetched`'s) were for is over with no use here (its turn went to another
        worker, or the advisory was withdrawn): as if their ttl had passed now. Pages it brought go to the lowest
        priority, pages that were already there back to their own. A page used since, or marked again by
        another prefetch (a prefix two sessions share), keeps what it has."""
        for node, mark in marks:
            if self._prefetched.get(node) is mark and mark.fresh_until > now:
                self._prefetched[node] = dataclasses.replace(mark, fresh_until=now)

    def hold(self, nodes: Iterable[TreeNodeLike], priority: int, ttl_s: float, now: float) -> None:
        """Raise the nodes to at least `priority` until `now + ttl_s` (a later hold replaces it)."""
        for node in nodes:
            self._held[node] = _Hold(priority, now + ttl_s)
            self._maybe_marked.add(id(node))

    def doom(self, nodes: Iterable[TreeNodeLike]) -> None:
        for node in nodes:
            self._doomed.add(node)
            self._maybe_marked.add(id(node))

    def pardon_all(self) -> None:
        """End a drop: whatever could not go stays, ranked as before."""
        self._doomed.clear()

    def forget(self, nodes: Iterable[TreeNodeLike]) -> None:
        for node in nodes:
            self._prefetched.pop(node, None)
            self._held.pop(node, None)

    # --- reading -------------------------------------------------------------------------------

    def might_be_marked(self, node: TreeNodeLike) -> bool:
        """False: the node has no mark, its rank is `(1, node.priority, 0, 0.0)` (a few node ids of nodes gone
        may answer True: then the full look-up decides)."""
        return id(node) in self._maybe_marked

    def is_unused_prefetch(self, node: TreeNodeLike) -> bool:
        mark = self._prefetched.get(node)
        return mark is not None and node.last_access_time <= mark.settled_access

    def effective_priority(self, node: TreeNodeLike, now: float) -> int:
        return self._rank(node, now)[0]

    def _rank(self, node: TreeNodeLike, now: float) -> tuple[int, float | None]:
        """The node's effective priority, and when a live hint expects its request (None: no live hint)."""
        expected: float | None = None
        mark = self._prefetched.get(node)
        if mark is not None and node.last_access_time <= mark.settled_access:
            if now < mark.fresh_until:
                priority, expected = max(mark.priority, int(node.priority)), mark.expected_at
            else:
                priority = LOWEST_PRIORITY if mark.brought else int(node.priority)
        else:
            priority = int(node.priority)
        hold = self._held.get(node)
        if hold is not None and now < hold.until:
            # A retain expects its request by its deadline (a tool's predicted end and a margin).
            if hold.priority > priority:
                priority, expected = hold.priority, hold.until
            else:
                expected = hold.until if expected is None else min(expected, hold.until)
        return priority, expected

    def eviction_rank(self, node: TreeNodeLike, now: float) -> tuple[int, int, int, float]:
        """Smaller goes first: (not being dropped, effective priority, a live hint expects it, how soon: the hint
        expected last first)."""
        doomed = node in self._doomed
        priority, expected = self._rank(node, now)
        hinted = expected is not None
        return (0 if doomed else 1, priority, 1 if hinted else 0, -expected if expected is not None else 0.0)

    def ranks_below(self, node: TreeNodeLike, priority: int, now: float, expected_at: float | None = None) -> bool:
        """Whether a hinted prefetch of `priority`, for a request expected at `expected_at` (None: not compared),
        may evict this node: a lower priority, its own priority unhinted, or hinted but expected after it."""
        own, expected = self._rank(node, now)
        if node in self._doomed or own < priority:
            return True
        if own > priority:
            return False
        return expected is None or (expected_at is not None and expected > expected_at)

    def rank_class(self, node: TreeNodeLike, now: float) -> str:
        """What a page evicted for a prefetch was, for the counters: `expired_hint` (an unused prefetch past its
        ttl), `unhinted` (no live hint), `hinted` (a live hint of a lower priority, or expected later)."""
        priority, expected = self._rank(node, now)
        if priority == LOWEST_PRIORITY and self.is_unused_prefetch(node):
            return "expired_hint"
        return "unhinted" if expected is None else "hinted"

    def counts(self) -> dict[str, int]:
        return {"prefetched": len(self._prefetched), "held": len(self._held)}

    # --- upkeep --------------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Forget holds past their deadline, prefetch marks whose node has been used, and marks of
        pages that were already there once their ttl has passed.

        An unused page a prefetch brought stays marked past its ttl: that mark is what keeps it at the
        lowest priority (its own priority may be higher, inherited from its parent).
        """
        for node, hold in list(self._held.items()):
            if now >= hold.until:
                del self._held[node]
        for node, mark in list(self._prefetched.items()):
            if node.last_access_time > mark.settled_access or (not mark.brought and now >= mark.fresh_until):
                del self._prefetched[node]
        marked = [*self._prefetched.keys(), *self._held.keys(), *self._doomed]
        self._maybe_marked = {id(node) for node in marked}
