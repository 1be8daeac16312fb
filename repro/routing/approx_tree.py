"""The cache-aware router's shared approximate radix tree (sglang-router's multi-tenant tree).

One tree for all workers: every node holds a run of units (characters of the request text,
or int32 tokens packed as 4 bytes each) and a dict tenant -> last access time (the workers
whose requests passed through the node). Facts taken from sglang-router's `tree.rs`
(behaviour only, written anew here):

- `insert(key, tenant)` walks/splits the tree, stamps `now_s` for `tenant` on every node of
  the path (root included) and counts a node's units towards `tenant` the first time the
  tenant appears on it; a split copies the tenant map to the new upper node.
- `prefix_match(key)` returns the matched length (a partial match inside a node counts) and
  one tenant of the node where matching stopped, and re-stamps that tenant on the path from
  that node to the root (an access, as in the real router).
- `evict_tenant_by_size(max_units)`: per tenant over budget, remove the tenant from its
  least recently accessed tenant-leaves (nodes no child of which carries the tenant) until
  it holds <= max_units; a node left with no tenant and no child is unlinked.

Choices the real router leaves to hash order (documented, configurable by the router's
`tie_break`): on a node shared by several tenants the real router takes the first key of a
DashMap (hash order, effectively arbitrary per process); here "index" takes the tenant that
reached the node first (dict insertion order, kept across splits), "random" draws one.

Why hand-written: it runs once per routed request on prompts of thousands of units; keys
are `str` or `bytes` and every comparison is a slice comparison (memcmp in C), with a
binary search for the mismatch point, never a Python loop over characters or tokens.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator

Key = str | bytes


class _Node:
    __slots__ = ("key", "children", "tenants", "parent")

    def __init__(self, key: Key, parent: "_Node | None") -> None:
        self.key = key
        self.children: dict[Key, _Node] = {}
        self.tenants: dict[int, float] = {}  # tenant -> last access time; order = arrival order
        self.parent = parent


def common_prefix_units(node_key: Key, key: Key, pos: int, unit: int) -> int:
    """Length (in key positions, a multiple of `unit`) of the common prefix of node_key and key[pos:]."""
    n = min(len(node_key), len(key) - pos)
    if key[pos : pos + n] == node_key[:n]:
        return n
    # Binary search over whole units (keys are whole units): lo units match, hi units do not.
    lo, hi = 0, n // unit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        b = mid * unit
        if key[pos : pos + b] == node_key[:b]:
            lo = mid
        else:
            hi = mid
    return lo * unit


class ApproximateTree:
    """Multi-tenant approximate radix tree; tenants are worker ids (ints).

    `unit` = positions per unit: 1 for `str` keys (characters), 4 for `bytes` keys of packed
    int32 tokens. Sizes and match lengths are reported in units.
    """

    def __init__(self, unit: int = 1) -> None:
        if unit not in (1, 4):
            raise ValueError(f"unit must be 1 (characters) or 4 (packed int32 tokens), got {unit}")
        self.unit = unit
        self.root = _Node(b"" if unit == 4 else "", None)
        self.tenant_size: dict[int, int] = {}  # units per tenant (sglang-router: tenant_char_count)

    # ------------------------------------------------------------------ updates
    def insert(self, key: Key, tenant: int, now_s: float) -> None:
        u = self.unit
        node = self.root
        node.tenants[tenant] = now_s
        size = self.tenant_size.get(tenant, 0)
        pos, n = 0, len(key)
        while pos < n:
            first = key[pos : pos + u]
            child = node.children.get(first)
            if child is None:
                leaf = _Node(key[pos:], node)
                leaf.tenants[tenant] = now_s
                node.children[first] = leaf
                size += (n - pos) // u
                break
            ck = child.key
            shared = common_prefix_units(ck, key, pos, u)
            if shared < len(ck):
                # Split: node -> upper(ck[:shared]) -> child(ck[shared:]).
                upper = _Node(ck[:shared], node)
                upper.tenants = dict(child.tenants)
                rest = ck[shared:]
                upper.children[rest[:u]] = child
                child.key = rest
                child.parent = upper
                node.children[first] = upper
                child = upper
            if tenant not in child.tenants:
                size += len(child.key) // u
            child.tenants[tenant] = now_s
            node = child
            pos += shared
        self.tenant_size[tenant] = size

    def prefix_match(self, key: Key, now_s: float, pick=None) -> tuple[int, int | None]:
        """(matched units, tenant of the node where matching stopped, or None if it has none).

        `pick(tenants_dict) -> tenant` chooses among the node's tenants (default: first).
        The chosen tenant is re-stamped from that node up to the root.
        """
        matched, node = self.walk(key)
        if not node.tenants:
            return matched, None
        tenant = pick(node.tenants) if pick is not None else next(iter(node.tenants))
        walk: _Node | None = node
        while walk is not None:
            if tenant in walk.tenants:
                walk.tenants[tenant] = now_s
            walk = walk.parent
        return matched, tenant

    def walk(self, key: Key) -> tuple[int, _Node]:
        """Read-only: (matched units, node where matching stopped — inside it on a partial match)."""
        u = self.unit
        node = self.root
        pos, n = 0, len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + u])
            if child is None:
                break
            shared = common_prefix_units(child.key, key, pos, u)
            pos += shared
            node = child
            if shared < len(child.key):
                break
        return pos // u, node

    def evict_tenant_by_size(self, max_units: int) -> int:
        """Trim every tenant to <= max_units, least recently accessed tenant-leaves first.

        Returns the number of (node, tenant) removals.
        """
        if all(size <= max_units for size in self.tenant_size.values()):
            return 0
        u = self.unit
        seq = itertools.count()
        heap: list[tuple[float, int, int, _Node]] = []
        for node in self._nodes():
            for tenant in self._leaf_tenants(node):
                heap.append((node.tenants[tenant], next(seq), tenant, node))
        heapq.heapify(heap)
        removed = 0
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.tenant_size.get(tenant, 0) <= max_units:
                continue
            if tenant in node.tenants:
                self.tenant_size[tenant] -= len(node.key) // u
                del node.tenants[tenant]
                removed += 1
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants:
                del parent.children[node.key[:u]]
            if tenant in parent.tenants and not any(
                tenant in c.tenants for c in parent.children.values()
            ):
                heapq.heappush(heap, (parent.tenants[tenant], next(seq), tenant, parent))
        return removed

    # ------------------------------------------------------------------ queries
    def smallest_tenants(self) -> list[int]:
        """Tenants holding the fewest units (all of them on a tie), in tenant-id order."""
        if not self.tenant_size:
            return []
        least = min(self.tenant_size.values())
        return sorted(t for t, s in self.tenant_size.items() if s == least)

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
