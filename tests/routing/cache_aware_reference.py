"""A slow, obviously-shaped reference of sglang-router 0.3.2's cache-aware rule (router + tree).

The tree is a dict: full path from the root (the string up to the end of a node) -> node
record. Parents and children are found by brute force over all paths, so there are no
pointers to keep right. Floats are rounded to float32 through `struct`, the way the real
router's `as f32` does. Written from the rule as stated in docs/ALGORITHMS.md §3, not from
repro/routing/cache_aware.py.
"""

from __future__ import annotations

import heapq
import math
import struct


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class RefNode:
    def __init__(self, tenants: dict[int, int], creator: int | None) -> None:
        self.tenants = tenants
        self.creator = creator


def lcp(a: str, b: str) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class RefTree:
    def __init__(self, order: list[int]) -> None:
        self.nodes: dict[str, RefNode] = {"": RefNode({}, None)}
        self.size: dict[int, int] = {}
        self.epoch = 0
        self.order = order

    def tick(self) -> int:
        self.epoch += 1
        return self.epoch - 1

    def parent(self, path: str) -> str:
        return max((p for p in self.nodes if len(p) < len(path) and path.startswith(p)), key=len)

    def children(self, path: str) -> list[str]:
        return [p for p in self.nodes if p != path and p.startswith(path) and self.parent(p) == path]

    def child_towards(self, cur: str, key: str) -> str | None:
        for c in self.children(cur):
            if c[len(cur)] == key[len(cur)]:
                return c
        return None

    def insert(self, key: str, t: int) -> None:
        self.nodes[""].tenants.setdefault(t, 0)
        self.size.setdefault(t, 0)
        cur = ""
        while cur != key:
            c = self.child_towards(cur, key)
            if c is None:
                self.nodes[key] = RefNode({t: self.tick()}, t)
                self.size[t] += len(key) - len(cur)
                return
            n = lcp(c, key)
            if n < len(c):  # split: a new node ends at key[:n], copying c's record
                old = self.nodes[c]
                self.nodes[c[:n]] = RefNode(dict(old.tenants), old.creator)
                c = c[:n]
            node = self.nodes[c]
            if t not in node.tenants:
                node.tenants[t] = 0
                self.size[t] += len(c) - len(cur)
            cur = c
        self.nodes[cur].tenants[t] = self.tick()

    def match(self, key: str) -> tuple[int, int | None]:
        cur, matched = "", 0
        while matched < len(key):
            c = self.child_towards(cur, key)
            if c is None:
                break
            n = lcp(c, key)
            matched = n
            cur = c
            if n < len(c):
                break
        node = self.nodes[cur]
        self.last_holders = sorted(node.tenants) if matched else []  # smg: candidates on a hit
        if node.creator in node.tenants:
            tenant = node.creator
        elif node.tenants:
            tenant = min(node.tenants, key=self.order.index)
            node.creator = tenant
        else:
            tenant = None
        e = self.tick()
        if tenant is not None and e % 8 == 0:
            node.tenants[tenant] = e
        return matched, tenant

    def is_leaf_for(self, path: str, t: int) -> bool:
        return t in self.nodes[path].tenants and not any(t in self.nodes[c].tenants for c in self.children(path))

    def evict(self, limit: int) -> bool:
        """Trim; returns True if an oldest leaf was not unique (equal stamps: the real router's
        heap order decides, the fast tree takes discovery order), where results may differ."""
        ambiguous = False
        # One tenant at a time: trimming one tenant never changes another's leaves or stamps.
        for t in sorted(self.size):
            while self.size[t] > limit:
                leaves = [p for p in self.nodes if p and self.is_leaf_for(p, t)]
                stamps = sorted(self.nodes[p].tenants[t] for p in leaves)
                ambiguous |= len(stamps) > 1 and stamps[0] == stamps[1]
                oldest = min(leaves, key=lambda p: self.nodes[p].tenants[t])
                self.size[t] -= len(oldest) - len(self.parent(oldest))
                del self.nodes[oldest].tenants[t]
                if not self.nodes[oldest].tenants and not self.children(oldest):
                    del self.nodes[oldest]
        return ambiguous

    def evict_total(self, limit: int) -> bool:
        """smg's trim: one budget for all tenants together, the oldest (node, tenant) leaf of any
        tenant first; True if an oldest leaf was not unique (see `evict`)."""
        ambiguous = False
        while sum(self.size.values()) > limit:
            leaves = [(self.nodes[p].tenants[t], p, t) for p in self.nodes if p for t in self.size
                      if self.is_leaf_for(p, t)]
            if not leaves:
                break
            leaves.sort()
            ambiguous |= len(leaves) > 1 and leaves[0][0] == leaves[1][0]
            _, oldest, t = leaves[0]
            self.size[t] -= len(oldest) - len(self.parent(oldest))
            del self.nodes[oldest].tenants[t]
            if not self.nodes[oldest].tenants and not self.children(oldest):
                del self.nodes[oldest]
        return ambiguous

    def dump(self) -> dict[str, tuple[dict[int, int], int | None]]:
        return {p: (dict(n.tenants), n.creator) for p, n in self.nodes.items() if p}


class RefCacheAware:
    def __init__(self, order: list[int], threshold=0.3, abs_thr=64, rel_thr=1.5, generation="v0_3_2"):
        self.order = list(order)
        self.loads = {w: 0 for w in order}
        self.tree = RefTree(self.order)
        for w in self.order:
            self.tree.insert("", w)
        self.threshold, self.abs_thr, self.rel_thr = threshold, abs_thr, rel_thr
        self.generation = generation

    def first_min(self, value) -> int:
        best = self.order[0]
        for w in self.order:
            if value(w) < value(best):
                best = w
        return best

    def least_loaded_lowest_id(self, candidates) -> tuple[int, bool]:
        """smg: the least loaded (a tie: the lowest id, standing in for the binary's random pick)."""
        low = min(self.loads[w] for w in candidates)
        ties = sorted(w for w in candidates if self.loads[w] == low)
        return ties[0], len(ties) > 1

    def route_smg(self, key: str) -> tuple[int, str]:
        """smg 1.13 (docs/ALGORITHMS.md §3): per-request spill gate, no global imbalance test."""
        matched, _ = self.tree.match(key)
        rate = f32(matched / len(key)) if key else 0.0
        everyone = list(self.loads)
        if self.tree.last_holders and rate > f32(self.threshold):
            w, _ = self.least_loaded_lowest_id(self.tree.last_holders)
            mean = sum(self.loads.values()) / len(self.loads)
            margin = min(self.abs_thr, max(4, math.ceil(2 * math.sqrt(mean))))
            if self.loads[w] > mean * self.rel_thr and self.loads[w] > mean + margin:
                (w, _), branch = self.least_loaded_lowest_id(everyone), "spill"
            else:
                branch = "hit"
        else:
            w, tied = self.least_loaded_lowest_id(everyone)
            branch = "low_match_tied" if tied else "low_match_untied"
        self.tree.insert(key, w)
        self.loads[w] += 1
        return w, branch

    def route(self, key: str) -> tuple[int, str]:
        if self.generation == "smg_1_13":
            return self.route_smg(key)
        lo, hi = min(self.loads.values()), max(self.loads.values())
        if hi - lo > self.abs_thr and f32(hi) > f32(f32(lo) * f32(self.rel_thr)):
            w, branch = self.first_min(self.loads.__getitem__), "imbalanced"
        else:
            matched, tenant = self.tree.match(key)
            rate = f32(matched / len(key)) if key else 0.0
            if rate > f32(self.threshold) and tenant is not None:
                w, branch = tenant, "hit"
            else:
                metric = self.tree.size if self.generation == "le_0_2_3" else self.loads
                w = self.first_min(metric.__getitem__)
                tied = sum(1 for v in metric.values() if v == metric[w]) > 1
                branch = "low_match_tied" if tied else "low_match_untied"
        self.tree.insert(key, w)
        self.loads[w] += 1
        return w, branch

    def complete(self, w: int) -> None:
        self.loads[w] = max(0, self.loads[w] - 1)


def dump_fast_tree(tree) -> dict[str, tuple[dict[int, int], int | None]]:
    """The fast ApproximateTree in the reference's path -> (tenants, creator) form."""
    out = {}
    stack = [(tree.root, "")]
    while stack:
        node, path = stack.pop()
        if node is not tree.root:
            out[path] = (dict(node.tenants), node.creator)
        for child in node.children.values():
            stack.append((child, path + child.key))
    return out
