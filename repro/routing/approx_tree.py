"""The cache-aware router's shared approximate radix tree (sglang-router 0.3.2's multi-tenant tree).

One tree for all workers: every node holds a run of units (characters of the routing key, or
int32 tokens packed as 4 bytes each for the other users of this structure) and a dict
tenant -> last access *epoch*, plus the tenant that created the node. Behaviour taken from
sglang-router 0.3.2's `tree.rs` (facts only, written anew here; docs/ALGORITHMS.md §3):

- Timestamps are epochs of one counter, not clock time: every `insert` and every
  `prefix_match` draws exactly one epoch (the real router's global `get_epoch()`).
- `insert(key, tenant)` walks/splits the tree. A tenant joining an existing node on the way
  gets timestamp 0 there (counted towards its size the first time); a split copies the tenant
  map (timestamps included) and the creator to the new upper node; only the node where the
  key ends (a new leaf, or the last node reached) is stamped with the epoch. The root holds
  every tenant (0 when it first arrives) and is stamped only by an empty key.
- `prefix_match(key)` returns the matched length (a partial match inside a node counts) and
  the creator of the node where matching stopped; if the creator has been trimmed off that
  node, the first remaining tenant in `tenant_order` (the real router: the node's hash order,
  which no one can predict; this is the stand-in) becomes its cached tenant. It re-stamps
  that tenant on that node only, and only when the epoch it drew is a multiple of 8.
- `evict_tenant_by_size(max_units)`: per tenant over budget, remove the tenant from its
  least recently stamped tenant-leaves (nodes no child of which carries the tenant) until it
  holds <= max_units; a node left with no tenant and no child is unlinked. Equal timestamps
  (the 0s of joined inner nodes) pop in discovery order here; the real router's binary heap
  orders them arbitrarily.

Why hand-written: it runs once per routed request on prompts of thousands of units; keys
are `str` or `bytes` and every comparison is a slice comparison (memcmp in C), with a
binary search for the mismatch point (`repro.kvcache.keys.common_prefix_len`, the comparator
every tree shares), never a Python loop over characters or tokens.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator, Sequence

from repro.kvcache.keys import common_prefix_len

Key = str | bytes


class _Node:
    __slots__ = ("key", "children", "tenants", "parent", "creator")

    def __init__(self, key: Key, parent: "_Node | None", creator: int | None = None) -> None:
        self.key = key
        self.children: dict[Key, _Node] = {}
        self.tenants: dict[int, int] = {}  # tenant -> last access epoch
        self.parent = parent
        self.creator = creator  # the real router's cached `last_tenant`


class ApproximateTree:
    """Multi-tenant approximate radix tree; tenants are worker ids (ints).

    `unit` = positions per unit: 1 for `str` keys (characters), 4 for `bytes` keys of packed
    int32 tokens. Sizes and match lengths are reported in units. `tenant_order` ranks tenants
    for the one choice the real router leaves to hash order (see the module docstring);
    default: ascending id.
    """

    def __init__(self, unit: int = 1, tenant_order: Sequence[int] | None = None) -> None:
        if unit not in (1, 4):
            raise ValueError(f"unit must be 1 (characters) or 4 (packed int32 tokens), got {unit}")
        self.unit = unit
        self.root = _Node(b"" if unit == 4 else "", None)
        self.tenant_size: dict[int, int] = {}  # units per tenant (sglang-router: tenant_char_count)
        self.epoch = 0  # next epoch to hand out
        self.hash_order_choices = 0  # fallbacks among >1 tenants (where the real router's pick is unknowable)
        self._rank = {t: i for i, t in enumerate(tenant_order)} if tenant_order is not None else None
        # prefix_match's descent (key, fully matched nodes, units consumed, partial node, its shared
        # units): an insert of the same key object right after it (the router's decide + commit)
        # resumes from there instead of walking again; any insert or trim clears it
        self._last_walk: tuple | None = None

    def _next_epoch(self) -> int:
        e = self.epoch
        self.epoch = e + 1
        return e

    # ------------------------------------------------------------------ updates
    def insert(self, key: Key, tenant: int) -> None:
        u = self.unit
        node = self.root
        node.tenants.setdefault(tenant, 0)
        size = self.tenant_size.get(tenant, 0)
        pos, n = 0, len(key)
        last = self._last_walk
        if last is not None:
            self._last_walk = None
            if last[0] is key:  # the tree is as prefix_match left it: replay its descent
                for child in last[1]:
                    if tenant not in child.tenants:
                        size += len(child.key) // u
                        child.tenants[tenant] = 0
                    node = child
                pos = last[2]
                child = last[3]
                if child is not None:  # matching stopped inside `child`: split it there
                    node = self._split_join(node, child, last[4], key[pos : pos + u])
                    if tenant not in node.tenants:
                        size += len(node.key) // u
                        node.tenants[tenant] = 0
                    pos += last[4]
                # a new leaf goes below `node` unless the key ended (no child of `node` starts
                # with the key's next unit: a full match would have continued, a split leaves one)
                epoch = self.epoch
                self.epoch = epoch + 1
                if pos < n:
                    leaf = _Node(key[pos:], node, tenant)
                    leaf.tenants[tenant] = epoch
                    node.children[key[pos : pos + u]] = leaf
                    self.tenant_size[tenant] = size + (n - pos) // u
                    return
                self.tenant_size[tenant] = size
                node.tenants[tenant] = epoch
                return
        while pos < n:
            first = key[pos : pos + u]
            child = node.children.get(first)
            if child is None:
                leaf = _Node(key[pos:], node, tenant)
                leaf.tenants[tenant] = self._next_epoch()
                node.children[first] = leaf
                self.tenant_size[tenant] = size + (n - pos) // u
                return
            ck = child.key
            # whole-node matches are the common case: one C-level compare, no slicing
            shared = len(ck) if key.startswith(ck, pos) else common_prefix_len(key, pos, ck, u)
            if shared < len(ck):
                child = self._split_join(node, child, shared, first)
            if tenant not in child.tenants:
                size += len(child.key) // u
                child.tenants[tenant] = 0
            node = child
            pos += shared
        self.tenant_size[tenant] = size
        node.tenants[tenant] = self._next_epoch()  # the key ended on an existing node (or root)

    def _split_join(self, node: _Node, child: _Node, shared: int, first: Key) -> _Node:
        """Split: node -> upper(ck[:shared]) -> child(ck[shared:]); upper copies the tenants. Returns upper."""
        u = self.unit
        ck = child.key
        upper = _Node(ck[:shared], node, child.creator)
        upper.tenants = dict(child.tenants)
        rest = ck[shared:]
        upper.children[rest[:u]] = child
        child.key = rest
        child.parent = upper
        node.children[first] = upper
        return upper

    def prefix_match(self, key: Key) -> tuple[int, int | None]:
        """(matched units, tenant of the node where matching stopped, or None if it has none).

        Draws one epoch; re-stamps the returned tenant on that node when the epoch is a multiple of 8.
        """
        u = self.unit
        node = self.root
        pos, n = 0, len(key)
        full = []
        partial = None
        shared = 0
        while pos < n:  # walk(), remembering the descent for an insert of the same key
            child = node.children.get(key[pos : pos + u])
            if child is None:
                break
            ck = child.key
            node = child
            if key.startswith(ck, pos):
                full.append(child)
                pos += len(ck)
            else:
                partial = child
                shared = common_prefix_len(key, pos, ck, u)
                break
        self._last_walk = (key, full, pos, partial, shared)
        matched = (pos + shared) // u
        tenants = node.tenants
        creator = node.creator
        # _node_tenant's common case inline: the creator still holds the node
        tenant = creator if creator is not None and creator in tenants else self._node_tenant(node)
        epoch = self.epoch
        self.epoch = epoch + 1
        if tenant is not None and epoch & 7 == 0:
            node.tenants[tenant] = epoch
        return matched, tenant

    def _node_tenant(self, node: _Node) -> int | None:
        tenants = node.tenants
        if node.creator is not None and node.creator in tenants:
            return node.creator
        if not tenants:
            return None
        if len(tenants) > 1 and node is not self.root:
            self.hash_order_choices += 1
        rank = self._rank
        fallback = min(tenants, key=rank.__getitem__) if rank is not None else min(tenants)
        node.creator = fallback
        return fallback

    def walk(self, key: Key) -> tuple[int, _Node]:
        """Read-only: (matched units, node where matching stopped — inside it on a partial match)."""
        u = self.unit
        node = self.root
        pos, n = 0, len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + u])
            if child is None:
                break
            ck = child.key
            node = child
            if key.startswith(ck, pos):
                pos += len(ck)
            else:
                pos += common_prefix_len(key, pos, ck, u)
                break
        return pos // u, node

    def evict_tenant_by_size(self, max_units: int) -> int:
        """Trim every tenant to <= max_units, least recently stamped tenant-leaves first.

        Returns the number of (node, tenant) removals.
        """
        self._last_walk = None
        if all(size <= max_units for size in self.tenant_size.values()):
            return 0
        u = self.unit
        seq = itertools.count()
        heap: list[tuple[int, int, int, _Node]] = []
        for node in self._nodes():
            for tenant in self._leaf_tenants(node):
                heap.append((node.tenants[tenant], next(seq), tenant, node))
        heapq.heapify(heap)
        removed = 0
        sizes = self.tenant_size
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if sizes.get(tenant, 0) <= max_units:
                continue
            if tenant not in node.tenants or any(tenant in c.tenants for c in node.children.values()):
                continue  # no longer a leaf for this tenant
            sizes[tenant] = max(0, sizes[tenant] - len(node.key) // u)
            del node.tenants[tenant]
            removed += 1
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants and node.key:
                del parent.children[node.key[:u]]
            if tenant in parent.tenants and not any(tenant in c.tenants for c in parent.children.values()):
                heapq.heappush(heap, (parent.tenants[tenant], next(seq), tenant, parent))
        return removed

    def evict_by_total_size(self, max_units: int) -> int:
        """smg >= 1.10's trim: one budget for the whole tree (all tenants together).

        While the total over tenants exceeds max_units, remove the least recently stamped
        (node, tenant) leaf among all tenants; the root is never trimmed. Returns the removals."""
        self._last_walk = None
        sizes = self.tenant_size
        total = sum(sizes.values())
        if total <= max_units:
            return 0
        u = self.unit
        seq = itertools.count()
        heap = [
            (node.tenants[t], next(seq), t, node)
            for node in self._nodes()
            if node is not self.root
            for t in self._leaf_tenants(node)
        ]
        heapq.heapify(heap)
        removed = 0
        while heap and total > max_units:
            _, _, tenant, node = heapq.heappop(heap)
            if tenant not in node.tenants or any(tenant in c.tenants for c in node.children.values()):
                continue  # no longer a leaf for this tenant
            size = len(node.key) // u
            sizes[tenant] = max(0, sizes[tenant] - size)
            total -= size
            del node.tenants[tenant]
            removed += 1
            parent = node.parent
            if not node.children and not node.tenants:
                del parent.children[node.key[:u]]
            if (
                parent is not self.root
                and tenant in parent.tenants
                and not any(tenant in c.tenants for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.tenants[tenant], next(seq), tenant, parent))
        return removed

    def last_match_holders(self, key: Key) -> tuple[int, ...]:
        """Tenants of the node where the last `prefix_match(key)` stopped (the deepest fully
        matched node, or the node it stopped inside), in id order; () if nothing matched.
        smg >= 1.10 chooses among these on a hit. Call right after prefix_match(key)."""
        last = self._last_walk
        if last is None or last[0] is not key:
            raise RuntimeError("last_match_holders needs the prefix_match of the same key just before")
        _, full, pos, partial, shared = last
        if pos + shared == 0:
            return ()
        node = partial if partial is not None else full[-1]
        return tuple(sorted(node.tenants))

    # ------------------------------------------------------------------ queries
    def used_size_per_tenant(self) -> dict[int, int]:
        """Recount sizes from the nodes (a check on `tenant_size`; O(tree))."""
        sizes = {t: 0 for t in self.tenant_size}
        for node in self._nodes():
            for tenant in node.tenants:
                sizes[tenant] = sizes.get(tenant, 0) + len(node.key) // self.unit
        return sizes

    def num_nodes(self) -> int:
        return sum(1 for _ in self._nodes())

    def _nodes(self) -> Iterator[_Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    @staticmethod
    def _leaf_tenants(node: _Node) -> list[int]:
        if not node.children:
            return list(node.tenants)
        below: set[int] = set()
        for child in node.children.values():
            below.update(child.tenants)
        return [t for t in node.tenants if t not in below]
