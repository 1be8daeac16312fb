"""Index of a whole trace of token paths: a compressed trie with per-node occurrence lists.

Used by OPT (next use of a cached token = first later path through its trie node, by
bisect), by the replayer's input checks (distinct tokens of a batch group) and for the
Fiat et al. phases of the token-access sequence (each phase but the last holds exactly
B distinct tokens). Trie nodes are split at every branch AND at every path end, so all
paths through any token of a trie node pass through the whole node: the occurrence list
and the access history are uniform inside a node.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

from repro.kvcache.keys import as_key, common_prefix_len


class TrieNode:
    __slots__ = ("key", "start", "end", "parent", "children", "occ", "base_id", "_parts")

    def __init__(self, key: bytes, start: int, end: int, parent: "TrieNode | None"):
        self.key = key  # tokens at depths start+1 .. end
        self.start = start
        self.end = end
        self.parent = parent
        self.children: dict[bytes, TrieNode] = {}
        self.occ: list[int] = []  # sorted indices of the trace paths through this node
        self.base_id = 0  # global id of the first token (ids are unique per distinct token)
        self._parts: list = []


class TraceIndex:
    """Build once per trace: `TraceIndex(paths)` with paths as token sequences or packed-int32 bytes."""

    def __init__(self, paths: Sequence):
        keys = [as_key(p) for p in paths]
        self.keys = keys
        self._phases_cache: dict[int, list[int]] = {}
        self._groups_cache: dict[int, list[int]] = {}
        self.num_paths = len(keys)
        self.root = TrieNode(b"", 0, 0, None)
        distinct: dict[bytes, list[int]] = {}
        for j, k in enumerate(keys):
            distinct.setdefault(k, []).append(j)
        for k in distinct:
            self._insert(k)
        # segments of each distinct path, then occurrence lists and token ids
        segs_of: dict[bytes, tuple[list, list]] = {}
        for k, occ in distinct.items():
            segs = self._segments(k)
            segs_of[k] = (segs, [s.end for s in segs])
            for s in segs:
                s._parts.append(occ)
        next_id = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.base_id = next_id
            next_id += node.end - node.start
            if node._parts:
                node.occ = sorted(j for part in node._parts for j in part)
                node._parts = []
            stack.extend(node.children.values())
        self.num_distinct_tokens = next_id
        self._path_segs = [segs_of[k] for k in keys]

    def _insert(self, key: bytes) -> None:
        node = self.root
        pos = 0
        end = len(key)
        while pos < end:
            child = node.children.get(key[pos : pos + 4])
            if child is None:
                new = TrieNode(key[pos:], node.end, end >> 2, node)
                node.children[key[pos : pos + 4]] = new
                return
            ck = child.key
            if key.startswith(ck, pos):
                pos += len(ck)
                node = child
                continue
            m = common_prefix_len(key, pos, ck)
            upper = TrieNode(ck[:m], child.start, child.start + (m >> 2), node)
            node.children[ck[:4]] = upper
            upper.children[ck[m : m + 4]] = child
            child.key = ck[m:]
            child.start = upper.end
            child.parent = upper
            node = upper
            pos += m
        # the path ends at a node boundary by construction (a split above, or an exact end)

    def _segments(self, key: bytes) -> list:
        out = []
        node = self.root
        pos = 0
        while pos < len(key):
            node = node.children[key[pos : pos + 4]]
            pos += len(node.key)
            out.append(node)
        assert pos == len(key), "trace trie lost a path end"
        return out

    def path_segments(self, j: int) -> tuple[list, list]:
        """(trie nodes along path j, their end depths)."""
        return self._path_segs[j]

    def path_len(self, j: int) -> int:
        return len(self.keys[j]) >> 2

    def next_use(self, tn: TrieNode, now: int) -> int | None:
        occ = tn.occ
        i = bisect_right(occ, now)
        return occ[i] if i < len(occ) else None

    def distinct_tokens(self, path_ids: Sequence[int]) -> int:
        """Number of distinct tokens in the union of the given paths."""
        seen = set()
        total = 0
        for j in path_ids:
            for s in self._path_segs[j][0]:
                if id(s) not in seen:
                    seen.add(id(s))
                    total += s.end - s.start
        return total

    def group_distinct_tokens(self, batch: int) -> list[int]:
        """distinct_tokens of each consecutive group of `batch` paths (memoised: each seed of a
        replay checks the same groups against the capacity)."""
        got = self._groups_cache.get(batch)
        if got is None:
            n = self.num_paths
            got = self._groups_cache[batch] = [
                self.distinct_tokens(range(g, min(n, g + batch))) for g in range(0, n, batch)
            ]
        return got

    def fiat_phases(self, capacity: int, order: Sequence[int] | None = None) -> list[int]:
        """Start positions (global token index) of the Fiat et al. phases of the token-access sequence.

        The sequence is the concatenation of the paths in `order` (default: trace order),
        each root to leaf. A phase ends just before the access that would make B + 1
        distinct tokens in it. len(result) = number of phases (0 for an empty trace).
        Works per trie segment: a segment's tokens are accessed as one block in order, so
        their last-phase values form at most two runs (a, b split at k).
        """
        if capacity < 1:
            raise ValueError("capacity must be >= 1 to count phases")
        if order is None:
            if capacity not in self._phases_cache:
                self._phases_cache[capacity] = self.fiat_phases(capacity, range(self.num_paths))
            return list(self._phases_cache[capacity])
        state: dict[int, list[int]] = {}  # id(segment) -> [a, b, k]
        starts: list[int] = []
        phase = 0
        count = 0
        pos = 0
        B = capacity
        for j in order:
            for s in self._path_segs[j][0]:
                length = s.end - s.start
                st = state.get(id(s))
                if st is None:
                    st = state[id(s)] = [0, 0, 0]
                a, b, k = st
                split_at = -1
                old_phase = phase
                i = 0
                while i < length:
                    if i < k:
                        val, e = a, k
                    else:
                        val, e = b, length
                    if val == phase and phase:
                        i = e
                        continue
                    if not phase:  # the very first access opens phase 1
                        phase = 1
                        starts.append(pos + i)
                        old_phase = phase
                        continue
                    room = B - count
                    if e - i <= room:
                        count += e - i
                        i = e
                    else:
                        if split_at >= 0:
                            raise ValueError(f"path {j} is longer than the capacity {B}: phases are undefined")
                        i += room
                        phase += 1
                        count = 0
                        starts.append(pos + i)
                        split_at = i
                if split_at < 0:
                    st[0] = st[1] = phase
                    st[2] = 0
                else:
                    st[0], st[1], st[2] = old_phase, phase, split_at
                pos += length
        return starts
