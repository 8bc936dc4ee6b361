"""Session KV operations on SGLang 0.5.23's UnifiedRadixCache (scheduler thread only).

- `install_fate_order`: puts `kv_fate.KVFate`'s ranking in front of the tree core's eviction
  strategy, so SGLang's own eviction (device and host tiers) takes pages in sessiongate's order.
  Needs the Python tree core (`UnifiedTreeCore`): SGLang 0.5.23's Rust core keeps node priority
  inside Rust (set only by an insert's `InsertParams.priority`, raised only) and its eviction
  order cannot be extended. The plug-in selects the Python core in every scheduler
  (`PYTHON_TREE_CORE_ENV`); it is the core SGLang itself falls back to for session-aware caching.
- `session_pages`: the tree nodes that hold a context's pages, by a read-only walk (no split, no
  access-time bump: looking must not count as using).
- `drop_pages`: the nodes of a context that are the session's alone and not in use, removed
  from the device and host tiers by SGLang's own eviction (they rank first while it runs), and
  their page files deleted from the `file` L3 pool.
- `evictable_below`: the device pages a hinted prefetch may displace (priority-based KV memory),
  in the order SGLang's eviction takes them.

A context's pages in the L3 pool (their keys, which the pool holds, deleting them) are `pool_pages`'.

Which pages are the session's (documented in docs/prefetch.md, "Session KV operations"): the
context's path in the tree, plus everything below the context's last page when the context ends
inside the tree (its continuation: the turn's own output), or the leaf it diverges from in its last
page only (the turn's output as generated, which the chat template renders back otherwise). A drop
takes only the part that no other context in this tree continues: it climbs from the bottom while a
node has no other child, so a prefix that another cached context shares (a common system prompt)
stays, in every tier. A node that a running request holds (device lock) or that a transfer holds
(host lock) stays too, with its pool pages. Pages of the context this tree does not hold at all are
the session's alone as far as this worker can tell, and their pool files are deleted.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessiongate.sglang_ext.kv_fate import KVFate

__all__ = [
    "PYTHON_TREE_CORE_ENV",
    "DropOutcome",
    "Evictable",
    "SessionPages",
    "Unsupported",
    "drop_pages",
    "evictable_below",
    "install_fate_order",
    "session_pages",
    "tier_tokens",
]

logger = logging.getLogger(__name__)

PYTHON_TREE_CORE_ENV = ("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")
_FATE_ATTR = "_sessiongate_fate_order"


class Unsupported(Exception):
    """The engine's cache cannot do this (another tree core or cache class)."""


class _FateOrder:
    """An eviction strategy: sessiongate's rank first, then the strategy SGLang configured."""

    def __init__(self, base: Any, fate: KVFate, clock: Callable[[], float]) -> None:
        self.base = base
        self._fate = fate
        self._clock = clock

    def get_priority(self, node: Any) -> tuple[Any, ...]:
        # SGLang ranks every evictable leaf on each eviction: an unmarked node (nearly all) skips the fate's tables.
        if not self._fate.might_be_marked(node):
            return (1, int(node.priority), 0, 0.0, self.base.get_priority(node))
        return (*self._fate.eviction_rank(node, self._clock()), self.base.get_priority(node))


def _python_core(cache: Any) -> Any:
    core = getattr(cache, "tree_core", None)
    if core is None or not hasattr(core, "eviction_strategy") or not hasattr(core, "root_node"):
        raise Unsupported(
            f"the radix cache ({type(cache).__name__}, tree core {type(core).__name__}) is not SGLang's "
            "UnifiedRadixCache with the Python tree core"
        )
    return core


def install_fate_order(cache: Any, fate: KVFate, clock: Callable[[], float]) -> bool:
    """Rank evictions by `fate` first; False (and nothing changed) on a cache that cannot."""
    try:
        core = _python_core(cache)
    except Unsupported as error:
        logger.warning("sessiongate: KV priority and drop unavailable: %s", error)
        return False
    if isinstance(core.eviction_strategy, _FateOrder):
        return True
    core.eviction_strategy = _FateOrder(core.eviction_strategy, fate, clock)
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    # The Full component binds the strategy's method on its first eviction (unless session-aware
    # caching wraps it); unbind it so the next eviction binds the new one.
    full = core.components_by_type.get(ComponentType.FULL)
    if full is not None and not cache.enable_session_radix_cache:
        full.session_ref_eviction_strategy = None
    return True


def _full(node: Any) -> Any:
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    return node.component_data[ComponentType.FULL]


@dataclass(frozen=True)
class SessionPages:
    """Where a context lies in the tree (nodes are the tree core's own objects)."""

    path: list[Any]
    """Nodes along the context from the root (excluded); the last may hold more than the context."""
    starts: list[int]
    """Token offset of each path node in the context."""
    matched_tokens: int
    ended: bool
    """The context's last whole page is in the tree: nodes below the path continue it."""
    below: list[Any]
    """When `ended`: every node under the last path node (the context's continuation)."""
    page_size: int
    full_tokens: int
    """The context's length in whole pages (tokens); only whole pages are cached."""

    @property
    def nodes(self) -> list[Any]:
        return [*self.path, *self.below]


def _descendants(node: Any) -> list[Any]:
    found: list[Any] = []
    stack = list(node.children.values())
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(child.children.values())
    return found


def session_pages(
    cache: Any, token_ids: array[int], cache_salt: str | None, extra_key: str | None = None
) -> SessionPages:
    from sglang.srt.mem_cache.radix_cache import RadixKey

    core = _python_core(cache)
    page = int(cache.page_size)
    key = RadixKey(token_ids=token_ids, extra_key=extra_key, cache_salt=cache_salt).page_aligned(page)
    node = core.root_node
    offset = 0
    path: list[Any] = []
    starts: list[int] = []
    while offset < len(key):
        child = node.children.get(key.child_key_at(offset, page))
        if child is None or (child.evicted and not child.backuped):
            partial = _partial_child(node, key, offset, page)
            if partial is not None:
                path.append(partial)
                starts.append(offset)
            break
        matched = child.key.match_at(key, offset, page_size=page)
        if matched == 0:
            break
        path.append(child)
        starts.append(offset)
        offset += matched
        if matched < len(child.key):
            break  # the context ends inside this node, or diverges from it
        node = child
    # A context that ends inside the tree has what follows as its continuation; one that diverges
    # inside a node shares only a prefix with that node's other tokens.
    ended = bool(path) and offset == len(key)
    below = _descendants(path[-1]) if ended else []
    return SessionPages(path, starts, offset, ended, below, page, len(key))


def _partial_child(node: Any, key: Any, offset: int, page: int) -> Any:
    """The child of `node` that the context's last page continues inside that page only, or None.

    A turn leaves the tokens it generated in the tree; the session's context renders that answer back through the
    chat template, whose end of message can differ, so the context's last page matches no child page for page. The
    child sharing the longest token prefix with that page (and no sibling sharing as long a one) is the turn's own.
    """
    rest = key.raw_token_ids()[offset:]
    if not rest or len(rest) > page:
        return None
    best: Any = None
    best_shared, tied = 0, False
    for child in node.children.values():
        theirs = child.key
        if theirs.cache_salt != key.cache_salt or theirs.extra_key != key.extra_key:
            continue
        if child.evicted and not child.backuped:
            continue
        shared = 0
        for ours, their in zip(rest, theirs.raw_token_ids(), strict=False):
            if ours != their:
                break
            shared += 1
        if shared > best_shared:
            best, best_shared, tied = child, shared, False
        elif shared and shared == best_shared:
            tied = True
    return None if tied else best


def tier_tokens(pages: SessionPages) -> tuple[int, int]:
    """Tokens of the context on the device and in host memory (each a prefix of the context)."""
    device = host = 0
    device_open = host_open = True
    for node, start in zip(pages.path, pages.starts, strict=True):
        span = min(len(node.key), pages.matched_tokens - start)
        full = _full(node)
        device_open = device_open and full.value is not None
        host_open = host_open and full.host_value is not None
        device += span if device_open else 0
        host += span if host_open else 0
    return device, host


def _locked(node: Any) -> bool:
    return any(data.lock_ref > 0 for data in node.component_data)


def _host_locked(node: Any) -> bool:
    return any(data.host_lock_ref > 0 for data in node.component_data)


def _exclusive_nodes(cache: Any, pages: SessionPages, floor_tokens: int = 0) -> list[Any]:
    """The session's nodes that no other cached context continues, none starting before `floor_tokens`."""
    if not pages.path or pages.starts[-1] < floor_tokens:
        return []
    last = pages.path[-1]
    if pages.ended:
        owned = [last, *pages.below]
    elif not last.children and pages.matched_tokens == pages.starts[-1] + len(last.key):
        owned = [last]  # the tree stops where the context goes on: the end of what is cached of it
    elif not last.children and pages.full_tokens - pages.matched_tokens <= pages.page_size:
        # It diverges inside a leaf, in its last page only: the turn left the tokens it generated, which the chat
        # template renders back otherwise at the end of the answer (its end-of-message tokens). The leaf is that
        # turn's own KV (another context sharing all but the last page of this one and then going on is the one
        # case taken with it: a recompute for that session, never a wrong page).
        owned = [last]
    else:
        return []  # it diverges from the tree earlier, or beside other children: all shared
    root = _python_core(cache).root_node
    starts = dict(zip(pages.path, pages.starts, strict=True))
    node = last
    while (
        node.parent is not None
        and node.parent is not root
        and len(node.parent.children) == 1
        and starts[node.parent] >= floor_tokens
    ):
        node = node.parent
        owned.append(node)
    return owned


@dataclass(frozen=True)
class Evictable:
    """Device pages a prefetch of some priority may evict, in eviction order."""

    tokens: int
    by_class: list[tuple[str, int]]
    """(`KVFate.rank_class`, tokens) per node, the first to go first."""

    def classes_of_first(self, tokens: int) -> dict[str, int]:
        """Tokens by rank class among the first `tokens` to go."""
        taken: dict[str, int] = {}
        for rank_class, size in self.by_class:
            if tokens <= 0:
                break
            share = min(size, tokens)
            taken[rank_class] = taken.get(rank_class, 0) + share
            tokens -= share
        return taken


def evictable_below(cache: Any, fate: KVFate, priority: int, now: float, expected_at: float | None = None) -> Evictable:
    """The device tokens SGLang's eviction reaches before any page a prefetch of `priority` (for a request expected
    at `expected_at`) must spare.

    Eviction takes device leaves; a node becomes a leaf once its device-resident children are gone. So
    from each evictable leaf this climbs while the node is device-resident, unlocked (no request holds
    it), ranks below the prefetch (`KVFate.ranks_below`) and has no other device-resident child left
    standing: what the walk counts is what an eviction of that many tokens, in rank order, can free
    without touching anything the prefetch must spare. A node some request holds is never counted.
    """
    core = _python_core(cache)
    root = core.root_node
    counted: set[Any] = set()
    found: list[tuple[tuple[Any, ...], str, int]] = []
    for leaf in list(core.evictable_device_leaves):
        node = leaf
        while node is not root and node is not None and node not in counted:
            value = _full(node).value
            if value is None or _locked(node) or not fate.ranks_below(node, priority, now, expected_at):
                break
            if any(child not in counted and _full(child).value is not None for child in node.children.values()):
                break
            counted.add(node)
            found.append((fate.eviction_rank(node, now), fate.rank_class(node, now), len(value)))
            node = node.parent
    found.sort(key=lambda item: item[0])
    return Evictable(sum(size for _, _, size in found), [(rank_class, size) for _, rank_class, size in found])


@dataclass(frozen=True)
class DropOutcome:
    device_tokens: int
    host_tokens: int
    kept_in_use_tokens: int
    """Tokens of the session's own pages that stayed because a request or a transfer holds them."""


def _closed_below(nodes: list[Any], allowed: Callable[[Any], bool]) -> set[Any]:
    """The nodes that satisfy `allowed` and whose every descendant does too (and is among `nodes`).

    A node leaves a tier only as a leaf of it, so a drop counts only such subtrees: a target
    larger than what can go would make SGLang's eviction take other nodes to reach it.
    """
    verdict: dict[Any, bool] = {}
    for node in sorted(set(nodes), key=_depth, reverse=True):  # children first
        verdict[node] = allowed(node) and all(verdict.get(child, False) for child in node.children.values())
    return {node for node, closed in verdict.items() if closed}


def _depth(node: Any) -> int:
    depth = 0
    while node.parent is not None:
        depth += 1
        node = node.parent
    return depth


def drop_pages(
    cache: Any, fate: KVFate, pages: SessionPages, context_hashes: list[str], floor_tokens: int = 0
) -> tuple[DropOutcome, list[str]]:
    """Remove the session's own pages from device and host; return what went and the pool hashes
    to delete (the caller deletes them: `delete_pool_pages`). Nothing before `floor_tokens` of the
    context is touched."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    owned = _exclusive_nodes(cache, pages, floor_tokens)
    # Locks propagate to the root: an unlocked node has no locked node below it.
    device_ok = _closed_below(owned, lambda node: not _locked(node))
    whole_ok = _closed_below(owned, lambda node: not _locked(node) and not _host_locked(node))
    device_target = sum(len(_full(n).value) for n in device_ok if _full(n).value is not None)
    kept = sum(len(n.key) for n in owned if n not in whole_ok)
    # Pool pages to delete: the context's pages from the first one the session owns alone (or
    # past everything the tree has of it), minus those of nodes that stay, plus the pages of the
    # nodes that go (their tail past the context and the continuation below it).
    path = list(zip(pages.path, pages.starts, strict=True))
    first_owned = min((start for node, start in path if node in owned), default=None)
    keep_until = max(pages.matched_tokens if first_owned is None else first_owned, floor_tokens)
    for node, start in path:
        if node in owned and node not in whole_ok:
            keep_until = max(keep_until, start + len(node.key))
    pool_hashes = dict.fromkeys(context_hashes[keep_until // pages.page_size :])
    for node in whole_ok:
        pool_hashes.update(dict.fromkeys(node.hash_value or ()))  # with the tail past the context

    fate.doom(owned)
    device_removed = host_removed = 0
    try:
        if device_target:
            device_removed = int(cache.evict(EvictParams(num_tokens=device_target)).num_tokens_evicted)
        # What the device eviction demoted is host-only now; those leaves go next.
        host_ok = _closed_below(owned, lambda node: node in whole_ok and _full(node).value is None)
        host_target = sum(len(_full(n).host_value) for n in host_ok if _full(n).host_value is not None)
        if host_target and getattr(cache, "cache_controller", None) is not None:
            host_removed = int(cache.evict_host(host_target))
    finally:
        fate.pardon_all()
    fate.forget(owned)
    outcome = DropOutcome(device_removed, host_removed, kept)
    return outcome, list(pool_hashes)
