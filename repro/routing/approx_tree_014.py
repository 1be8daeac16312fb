"""sglang-router 0.1.4's multi-tenant approximate tree (the cache-aware router of sglang 0.4.6).

Same shape as `ApproximateTree` (0.3.2's, whose trim and queries it reuses), three rules
differ (read from 0.1.4's `src/tree.rs`, facts only; docs/ALGORITHMS.md §3):

- Stamps are clock milliseconds, not epochs: `insert(key, tenant, now_ms)` stamps the tenant on
  every node of the key's path (root, nodes passed or joined, the split's upper part, the new
  leaf); a tenant joining a node is counted towards its size the first time.
- A node has no creator: the tenant `prefix_match` reports is the first of the node's tenants in
  the node's own hash-map order. The real map's hasher is seeded at random per node (a split's
  upper part is a clone: same order); here every node draws a salt from the tree's seeded RNG,
  the split's upper part copies it, and tenants rank by hash((salt, tenant)). That tenant is
  then stamped with `now_ms` on the node where matching stopped and on every ancestor.
- `smallest_tenant(order)`: the first tenant of `order` holding the fewest units (the real
  router scans its size map in hash order and keeps the first strict minimum).

The trim (`evict_tenant_by_size`) is 0.3.2's: per tenant, least recently stamped tenant-leaves
first (equal stamps: the real heap's order is arbitrary, ours is discovery order).
"""

from __future__ import annotations

import random
from typing import Sequence

from repro.kvcache.keys import common_prefix_len
from repro.routing.approx_tree import ApproximateTree, Key, _Node


class _HashNode(_Node):
    __slots__ = ("salt",)

    def __init__(self, key: Key, parent: "_Node | None", salt: int) -> None:
        super().__init__(key, parent, None)
        self.salt = salt


class HashOrderTree(ApproximateTree):
    """0.1.4's tree (module docstring). `seed` seeds the per-node hash orders."""

    def __init__(self, seed: int = 0, unit: int = 1) -> None:
        super().__init__(unit=unit)
        self._salts = random.Random(seed)
        self.root = _HashNode(self.root.key, None, self._salt())

    def _salt(self) -> int:
        return self._salts.getrandbits(61)

    def first_tenant(self, node: _Node) -> int | None:
        """The first of `node`'s tenants in its hash order (None if it has none)."""
        tenants = node.tenants
        if len(tenants) < 2:
            return next(iter(tenants), None)
        salt = node.salt  # type: ignore[attr-defined]
        return min(tenants, key=lambda t: hash((salt, t)))

    # ------------------------------------------------------------------ updates
    def insert(self, key: Key, tenant: int, now_ms: int = 0) -> None:
        self._last_walk = None
        u = self.unit
        node = self.root
        size = self.tenant_size.get(tenant, 0)
        node.tenants[tenant] = now_ms
        pos, n = 0, len(key)
        while pos < n:
            first = key[pos : pos + u]
            child = node.children.get(first)
            if child is None:
                leaf = _HashNode(key[pos:], node, self._salt())
                leaf.tenants[tenant] = now_ms
                node.children[first] = leaf
                size += (n - pos) // u
                break
            ck = child.key
            shared = len(ck) if key.startswith(ck, pos) else common_prefix_len(key, pos, ck, u)
            if shared < len(ck):
                child = self._split(node, child, shared, first)
            if tenant not in child.tenants:
                size += len(child.key) // u
            child.tenants[tenant] = now_ms
            node = child
            pos += shared
        self.tenant_size[tenant] = size

    def _split(self, node: _Node, child: _Node, shared: int, first: Key) -> _Node:
        """node -> upper(ck[:shared]) -> child(ck[shared:]); upper clones the tenant map (and its order)."""
        u = self.unit
        ck = child.key
        upper = _HashNode(ck[:shared], node, child.salt)  # type: ignore[attr-defined]
        upper.tenants = dict(child.tenants)
        rest = ck[shared:]
        upper.children[rest[:u]] = child
        child.key = rest
        child.parent = upper
        node.children[first] = upper
        return upper

    def prefix_match(self, key: Key, now_ms: int = 0) -> tuple[int, int | None]:
        """(matched units, first tenant of the node where matching stopped, in its hash order);
        stamps that tenant there and on every ancestor. A node without tenants: (matched, None)."""
        matched, node = self.walk(key)
        tenant = self.first_tenant(node)
        if tenant is not None:
            if len(node.tenants) > 1:
                self.hash_order_choices += 1
            while node is not None:
                node.tenants[tenant] = now_ms
                node = node.parent
        return matched, tenant

    def last_stop_tenants(self, key: Key) -> tuple[int, ...]:
        """Read-only: the tenants of the node where matching `key` stops (what the hash order picks among)."""
        return tuple(sorted(self.walk(key)[1].tenants))

    def smallest_tenant(self, order: Sequence[int]) -> int:
        sizes = self.tenant_size
        return min(order, key=lambda t: sizes.get(t, 0))
