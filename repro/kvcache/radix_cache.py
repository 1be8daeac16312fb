"""Compressed radix tree over token ids with SGLang's verbs and a pluggable leaf-eviction policy.

Hand-written on purpose: this is the simulator's hottest path (every request walks it on
every worker, routers peek it for every worker), so it uses plain `__slots__` nodes and
keys of packed int32 bytes whose comparison runs in C (`bytes.startswith`, memcmp), never
token by token in Python. One module (over 450 lines) because the tree's verbs and the
eviction verbs policies call share one node representation and one set of counters.

Choices the paper leaves open (ALGORITHMS.md §2 fixes them; stated here once):

* A token is identified by its path prefix. Only leaf tokens are evictable, never a token
  on a locked path (`lock_ref > 0`, SGLang's meaning). The tree is prefix-closed by
  construction.
* LRU recency of a token = the position of its latest access in the global token-access
  sequence. `match_prefix` and `insert` access their tokens root to leaf, one position per
  token (`self.clock` counts positions), so every token's latest position is unique and a
  node's tokens carry consecutive positions: `node.stamp` is the position of its last token.
* Node granularity follows SGLang 0.5.23 exactly: an access that ends inside a node also
  stamps the unaccessed remainder below the split (recency only, never RLT marks), so our
  node-granularity LRU matches SGLang's RadixCache (tests/sglang/test_parity.py).
* Nodes are split at access boundaries (the end of every match / insert, and RLT phase
  resets inside an inserted run), so an access covers whole nodes: inside one node all
  tokens share their access history, hence their marks. Nodes are never merged back.
* Granularity `token` (the paper's model): `evict(n)` removes exactly `n` leaf tokens, one
  victim token at a time (a leaf node offers its last token). Granularity `node` (SGLang):
  whole leaf nodes are evicted and `evict(n)` may overshoot.
* `insert` never evicts (SGLang's contract); the caller frees room with `evict` first.
* `process_path` is the paper's single-path model (Appendix C): token by token, a hit if
  cached, else a miss that evicts one victim when the cache is full; the replayer and the
  theory experiment use it. It is exact for LRU/OPT/RLT (see its docstring); the bulk verbs
  differ from it only in RLT marks, as documented in `repro.kvcache.RLTEviction`.

Node handles returned by `match_prefix` / `insert` / `process_path` stay valid while the
node is locked; an unlocked node may be split (the handle keeps the deeper part and stays
valid), truncated or evicted.

The granularity is the cache's (policies read `cache.granularity`). Policies change the
tree only through `truncate_leaf` / `truncate_leaves` / `evict_leaf`, which keep the
counters and call the eviction hooks; the node fields `mark`, `lidx`, `hdirty`, `okey`, `tn` are theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

import numpy as np

from repro.kvcache.keys import as_key, common_prefix_len

if TYPE_CHECKING:  # pragma: no cover
    from repro.kvcache.eviction.base import EvictionPolicy

GRANULARITIES: tuple[str, ...] = ("token", "node")
_tuple_new = tuple.__new__  # builds the verbs' NamedTuple results without their Python-level __new__


class CapacityError(RuntimeError):
    """The tokens to add do not fit in the cache (free room or evictable tokens are too few)."""


class Node:
    """A run of `n` tokens (`key`, packed int32) ending at depth `depth` (in tokens).

    Policy fields: `mark` (RLT: marked iff equal to the policy's phase), `lidx` (RLT: index
    in its candidate list, -1 if not an evictable leaf), `hdirty` (RLT: the fallback LRU heap
    needs a fresh entry), `okey` (OPT: current heap key), `tn` (OPT: trace-trie node of the
    last token), `state` (any other policy's, None until it sets it). `seq` breaks heap ties
    deterministically.
    """

    __slots__ = (
        "key",
        "n",
        "depth",
        "parent",
        "children",
        "lock_ref",
        "stamp",
        "seq",
        "mark",
        "lidx",
        "hdirty",
        "okey",
        "tn",
        "state",
    )

    def __init__(self, key: bytes, n: int, depth: int, parent: "Node | None", stamp: int, seq: int):
        self.key = key
        self.n = n
        self.depth = depth
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.lock_ref = 0
        self.stamp = stamp
        self.seq = seq
        self.mark = 0
        self.lidx = -1
        self.hdirty = False
        self.okey = None
        self.tn = None
        self.state = None

    def __lt__(self, other: "Node") -> bool:  # only reached on equal heap keys
        return self.seq < other.seq

    def __repr__(self) -> str:
        return f"Node(n={self.n}, depth={self.depth}, lock_ref={self.lock_ref}, stamp={self.stamp})"


class MatchResult(NamedTuple):
    length: int  # matched tokens
    last_node: Node  # node ending exactly at the match boundary (root if nothing matched)


class InsertResult(NamedTuple):
    prefix_len: int  # tokens that were cached already
    last_node: Node  # node ending at the end of the inserted tokens


class PathResult(NamedTuple):
    hits: int
    misses: int
    evicted: int  # tokens evicted to make room
    last_node: Node  # end of the path, LOCKED (the caller dec_lock_ref's it when done)


class RadixCache:
    """Radix-tree KV cache of `capacity_tokens` tokens; see the package docstring for the contract."""

    def __init__(
        self,
        capacity_tokens: int,
        eviction: "EvictionPolicy | None" = None,
        granularity: str | None = None,
        *,
        record_evictions: bool = False,
    ):
        if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, (int, np.integer)):
            raise ValueError(f"capacity_tokens must be an int, got {capacity_tokens!r}")
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        if eviction is None:
            from repro.kvcache.eviction.lru import LRUEviction

            eviction = LRUEviction()
        if granularity is None:
            granularity = "node"
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        self._capacity = int(capacity_tokens)
        self.granularity = granularity
        self.root = Node(b"", 0, 0, None, 0, 0)
        self.root.lock_ref = 1  # never evicted, never a candidate
        self._seq = 1
        self._num_nodes = 0
        self.clock = 0  # token-access positions handed out so far
        self._total = 0
        self._evictable = 0
        self._protected = 0
        self.evicted_tokens = 0  # total evicted so far
        # hooks, None unless set (one attribute test per eviction): tests, and LBGR's tracker
        # caches, whose shared prefix index listens to evictions (repro.routing.trackers)
        self.eviction_log: list[bytes] | None = [] if record_evictions else None
        self.debug_on_evict: Callable[[Node, int], None] | None = None
        self.policy = eviction
        # RLT as shipped: a match marks only the upper part of a node it splits (_touch_split)
        self._match_marks_split_only = bool(getattr(eviction, "match_touches_split_only", False))
        eviction._attach(self)

    # ------------------------------------------------------------------ sizes
    @property
    def capacity_tokens(self) -> int:
        return self._capacity

    def total_size(self) -> int:
        return self._total

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def free_tokens(self) -> int:
        return self._capacity - self._total

    def num_nodes(self) -> int:
        return self._num_nodes

    def stats(self) -> dict:
        """Counters a simulator/benchmark reads (policy counters included)."""
        out = {
            "capacity_tokens": self._capacity,
            "total_tokens": self._total,
            "evictable_tokens": self._evictable,
            "protected_tokens": self._protected,
            "evicted_tokens": self.evicted_tokens,
            "num_nodes": self._num_nodes,
        }
        out.update(self.policy.stats())
        return out

    # ------------------------------------------------------------------ walking
    def _walk(self, key: bytes, node: "Node | None" = None):
        """Side-effect-free descent from `node` (the root by default): (fully matched nodes below
        it, matched bytes of key, partially matched child, its matched bytes)."""
        if node is None:
            node = self.root
        pos = 0
        end = len(key)
        path = []
        while pos < end:
            child = node.children.get(key[pos : pos + 4])
            if child is None:
                break
            ck = child.key
            nb = child.n << 2
            if len(ck) != nb:  # lazily applied token-granularity truncation
                ck = child.key = ck[:nb]
            if key.startswith(ck, pos):
                path.append(child)
                pos += nb
                node = child
            else:
                return path, pos, child, common_prefix_len(key, pos, ck)
        return path, pos, None, 0

    def peek_prefix(self, tokens) -> int:
        """Longest cached prefix, read-only: no split, no stamp, no mark (what routers call)."""
        key = tokens if type(tokens) is bytes and not (len(tokens) & 3) else as_key(tokens)
        _, pos, _, m = self._walk(key)
        return (pos + m) >> 2

    def _split(self, child: Node, k: int) -> Node:
        """Split `child` after its first k tokens; the new upper node is returned, `child` keeps the rest."""
        ck = child.key
        nb = child.n << 2
        kb = k << 2
        rest = child.n - k
        upper = Node(ck[:kb], k, child.depth - rest, child.parent, child.stamp - rest, self._seq)
        self._seq += 1
        self._num_nodes += 1
        upper.lock_ref = child.lock_ref
        upper.mark = child.mark
        upper.children[ck[kb : kb + 4]] = child
        child.parent.children[ck[:4]] = upper
        child.key = ck[kb:nb]
        child.n = rest
        child.parent = upper
        self.policy.split(upper, child)
        return upper

    def _touch(self, path: list, base: int) -> None:
        touch = self.policy.touch
        for node in path:
            node.stamp = base + node.depth
            touch(node)

    def _touch_split(self, path: list, base: int, split: bool) -> None:
        """A match's access for a policy with `match_touches_split_only` (RLT as shipped): every
        node is stamped, only the upper part of a node the match split (`split`) is touched."""
        for node in path:
            node.stamp = base + node.depth
        if split:
            self.policy.touch(path[-1])

    def _stamp_split_remainder(self, lower: Node, upper: Node) -> None:
        """SGLang's node-granularity recency rule: an access that ends inside a node stamps the
        whole node before splitting it, so the unaccessed remainder below the split counts as
        accessed now (SGLang 0.5.23 `_match_prefix_helper` / `_insert_helper`). Recency only:
        RLT marks stay on accessed tokens. Token granularity (the paper's model) and
        `process_path` stamp accessed tokens only. Needed for exact parity with SGLang's LRU
        (tests/sglang/test_parity.py)."""
        if lower.parent is upper:
            lower.stamp = upper.stamp
            self.policy.restamp(lower)

    def _append(self, parent: Node, kb: bytes, base: int, marked: bool) -> Node:
        """Attach the uncached run `kb` below `parent` (its end must be an access boundary)."""
        n = len(kb) >> 2
        node = Node(kb, n, parent.depth + n, parent, 0, self._seq)
        node.stamp = base + node.depth
        self._seq += 1
        self._num_nodes += 1
        if not parent.children and parent.lock_ref == 0:
            self.policy.leaf_removed(parent)  # an evictable leaf gets a child
        parent.children[kb[:4]] = node
        self._total += n
        self._evictable += n
        self.policy.new_node(node, marked)
        return node

    def _ancestry(self, node: Node) -> list:
        """The nodes from below the root down to `node` (empty for the root), root to leaf."""
        root = self.root
        path = []
        while node is not root:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    # ------------------------------------------------------------------ verbs
    def match_prefix(self, tokens) -> MatchResult:
        """Longest cached prefix; an access (stamps and marks the matched tokens); splits at the boundary."""
        key = tokens if type(tokens) is bytes and not (len(tokens) & 3) else as_key(tokens)
        path, pos, child, m = self._walk(key)
        if child is not None:
            path.append(self._split(child, m >> 2))
            pos += m
        if not path:
            return _tuple_new(MatchResult, (0, self.root))
        length = pos >> 2
        base = self.clock
        if self._match_marks_split_only:
            self._touch_split(path, base, child is not None)
        else:
            self._touch(path, base)
        self.clock = base + length
        if child is not None and self.granularity == "node":
            self._stamp_split_remainder(child, path[-1])
        return _tuple_new(MatchResult, (length, path[-1]))

    def insert(self, tokens) -> InsertResult:
        """Access every token of `tokens`, adding the uncached suffix; never evicts.

        Raises CapacityError (and changes nothing) if the new tokens exceed `free_tokens()`.
        """
        key = tokens if type(tokens) is bytes and not (len(tokens) & 3) else as_key(tokens)
        path, pos, child, m = self._walk(key)
        return self._insert_walked(key, 0, path, pos, child, m, 0)

    def _insert_walked(
        self, key: bytes, above: int, path: list, pos: int, child, m: int, inserted_len: int
    ) -> InsertResult:
        """insert's second half, once `key` was walked (`above` tokens of the path lie above
        key[0]; `path` the fully matched nodes, `child` the one key diverges in after `m` bytes):
        split, stamp / mark root to leaf, append the uncached suffix, move the clock."""
        new_bytes = len(key) - pos - m
        if new_bytes and (new_bytes >> 2) > self._capacity - self._total:
            raise CapacityError(
                f"insert needs {new_bytes >> 2} new tokens but only {self._capacity - self._total} are free "
                f"(capacity {self._capacity}); call evict() first or lock less"
            )
        if child is not None:
            path.append(self._split(child, m >> 2))
            pos += m
        base = self.clock
        if path:
            self._touch(path, base)
            if child is not None and self.granularity == "node":
                self._stamp_split_remainder(child, path[-1])
        last = path[-1] if path else self.root
        prefix_len = above + (pos >> 2)
        if new_bytes:
            last = self._append(last, key[pos:], base, True)
        self.policy.inserted(path, inserted_len, last if new_bytes else None)
        self.clock = base + above + (len(key) >> 2)
        return _tuple_new(InsertResult, (prefix_len, last))

    def insert_after(self, node: Node, tokens, inserted_len: int | None = None) -> InsertResult:
        """`insert(path_key(node) + tokens)` for an attached node (one a recent match / insert
        returned, still in the tree: e.g. locked), without walking or copying the path to it.

        The same access: the path root..node and the tokens below it are stamped / marked in
        root-to-leaf order, the uncached suffix is added, the clock moves by the whole length.
        The simulator inserts a prompt's computed chunk and its generated tokens this way,
        below the prompt's locked node (tests/kvcache check it against `insert`).
        `inserted_len` (default: node's depth, a request continuing its own insert): what the
        policy hears as SGLang's `InsertParams.inserted_len` (0 for a request's first chunk).
        """
        key = tokens if type(tokens) is bytes and not (len(tokens) & 3) else as_key(tokens)
        root = self.root
        if node is not root and node.parent is None:
            raise ValueError("insert_after on an evicted node; use a node returned by a recent match/insert")
        path = self._ancestry(node)
        below, pos, child, m = self._walk(key, node)
        path += below
        return self._insert_walked(
            key, node.depth, path, pos, child, m, node.depth if inserted_len is None else inserted_len
        )

    def access_path(self, node: Node) -> MatchResult:
        """`match_prefix(path_key(node))` for an attached node, without walking: the same
        access (the path's stamps and marks, root to leaf; the clock moves by its length); no
        split, since the path ends where `node` does."""
        root = self.root
        if node is root:
            return _tuple_new(MatchResult, (0, root))
        if node.parent is None:
            raise ValueError("access_path on an evicted node; use a node returned by a recent match/insert")
        base = self.clock
        if self._match_marks_split_only:
            self._touch_split(self._ancestry(node), base, False)
        else:
            self._touch(self._ancestry(node), base)
        self.clock = base + node.depth
        return _tuple_new(MatchResult, (node.depth, node))

    def inc_lock_ref(self, node: Node) -> int:
        """Lock the path root..node; returns the change of protected_size()."""
        if node is self.root:
            return 0
        if node.parent is None:
            raise ValueError("inc_lock_ref on an evicted node; lock a node returned by a recent match/insert")
        if node.lock_ref == 0 and not node.children:
            self.policy.leaf_removed(node)
        delta = 0
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                delta += node.n
            node.lock_ref += 1
            node = node.parent
        self._evictable -= delta
        self._protected += delta
        return delta

    def dec_lock_ref(self, node: Node) -> int:
        """Unlock the path root..node; returns the change of protected_size() (<= 0)."""
        if node is self.root:
            return 0
        if node.lock_ref <= 0:
            raise ValueError(
                "dec_lock_ref below zero: this node is not locked (each dec_lock_ref must pair with an inc_lock_ref)"
            )
        first = node
        delta = 0
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += node.n
            node = node.parent
        self._evictable += delta
        self._protected -= delta
        if first.lock_ref == 0 and not first.children:
            self.policy.leaf_added(first)
        return -delta

    def evict(self, num_tokens: int) -> int:
        """Evict >= num_tokens evictable leaf tokens (exactly at token granularity); returns the count."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)):
            raise ValueError(f"num_tokens must be an int, got {num_tokens!r}")
        if num_tokens <= 0:
            return 0
        return self.policy.evict(int(num_tokens))[0]

    # ------------------------------------------------------------------ what policies evict with
    def truncate_leaf(self, node: Node, k: int) -> None:
        """Evict the last k tokens (0 < k < node.n) of the evictable leaf `node`; it stays a leaf.

        Its new last token was accessed k positions earlier: `node.stamp` drops by k (the
        policy re-files the node if it orders by stamp). No policy hook is called.
        """
        if self.debug_on_evict is not None:
            self.debug_on_evict(node, k)
        if self.eviction_log is not None:
            self._log_eviction(node, k)
        self._total -= k
        self._evictable -= k
        self.evicted_tokens += k
        node.n -= k
        node.depth -= k
        node.stamp -= k

    def truncate_leaves(self, nodes: list, counts: list) -> list:
        """Bulk `truncate_leaf` (RLT's token windows): each evictable leaf nodes[i] loses its
        last counts[i] tokens if it keeps one; counts of 0 are skipped, and nodes with
        counts[i] >= their length are left untouched for the caller to empty (`evict_leaf`):
        returns those as [(node, count)] in input order."""
        rest = []
        if self.debug_on_evict is not None or self.eviction_log is not None:
            for node, k in zip(nodes, counts):
                if k:
                    if k < node.n:
                        self.truncate_leaf(node, k)
                    else:
                        rest.append((node, k))
            return rest
        done = 0
        for node, k in zip(nodes, counts):
            if k:
                n = node.n - k
                if n > 0:
                    node.n = n
                    node.depth -= k
                    node.stamp -= k
                    done += k
                else:
                    rest.append((node, k))
        self._total -= done
        self._evictable -= done
        self.evicted_tokens += done
        return rest

    def evict_leaf(self, node: Node) -> None:
        """Evict the whole evictable leaf `node`: the policy hears `leaf_removed(node)`, then
        `leaf_added(parent)` if the parent became an evictable leaf."""
        r = node.n
        if self.debug_on_evict is not None:
            self.debug_on_evict(node, r)
        if self.eviction_log is not None:
            self._log_eviction(node, r)
        self._total -= r
        self._evictable -= r
        self.evicted_tokens += r
        parent = node.parent
        del parent.children[node.key[:4]]
        node.parent = None
        self._num_nodes -= 1
        self.policy.leaf_removed(node)
        if not parent.children and parent.lock_ref == 0:
            self.policy.leaf_added(parent)

    def _log_eviction(self, node: Node, r: int) -> None:
        full = self.path_key(node)
        self.eviction_log.extend(full[: len(full) - 4 * i] for i in range(r))

    # ------------------------------------------------------------------ the paper's path model
    def process_path(self, tokens, lock: bool = True) -> PathResult:
        """Process one complete path token by token (paper §3.2 / App. C); returns it LOCKED
        (`lock=False`: unlocked again, as `dec_lock_ref(result.last_node)` would).

        For k = 1..|path|: the prefix path[:k] is a hit if cached, else a miss; a miss with
        the cache full first evicts one victim (a whole node at node granularity) among the
        evictable leaves, then the token is cached. The path's own tokens are locked.
        Implemented in bulk with the same outcome: hits come first (prefix-closed cache),
        victims never depend on the locked new tokens, and an RLT phase reset found at the
        e-th evicted token splits the new run where the token-by-token model resets (the run
        before it ends unmarked, the run after it marked). Raises CapacityError if the
        evictable tokens cannot make room (only possible when other paths are locked); the
        path's cached prefix has then been accessed and evictable tokens evicted, nothing added.
        """
        key = tokens if type(tokens) is bytes and not (len(tokens) & 3) else as_key(tokens)
        n = len(key) >> 2
        if n > self._capacity:
            raise CapacityError(f"a path of {n} tokens cannot fit in a cache of {self._capacity} tokens")
        path, pos, child, m = self._walk(key)
        if child is not None:
            path.append(self._split(child, m >> 2))
            pos += m
        base = self.clock
        if path:
            self._touch(path, base)
        node = path[-1] if path else self.root
        hits = pos >> 2
        misses = n - hits
        self.clock = base + hits
        if not misses and not lock:
            # a cached path locked and unlocked: counters and locks end as they were; the policy
            # hears what the pair tells it (an unlocked leaf leaves its candidates and comes back)
            if node.lock_ref == 0 and not node.children:  # never the root: its lock_ref stays 1
                self.policy.leaf_removed(node)
                self.policy.leaf_added(node)
            return _tuple_new(PathResult, (hits, 0, 0, node))
        self.inc_lock_ref(node)
        evicted = 0
        if misses:
            free = self._capacity - self._total
            reset_at = None
            if misses > free:
                need = misses - free
                evicted, reset_at = self.policy.evict(need)
                if evicted < need:
                    self.dec_lock_ref(node)
                    raise CapacityError(
                        f"a path needs {need} more free tokens but only {evicted} were evictable "
                        f"(capacity {self._capacity}, {self._protected} locked): lock fewer paths or raise the capacity"
                    )
            if reset_at is None or free + reset_at == 0:
                new = self._append(node, key[pos:], base, True)
            else:
                cut = pos + ((free + reset_at) << 2)
                mid = self._append(node, key[pos:cut], base, False)
                new = self._append(mid, key[cut:], base, True)
            self.inc_lock_ref(new)
            self.dec_lock_ref(node)
            node = new
        self.clock = base + n
        if not lock:
            self.dec_lock_ref(node)
        return PathResult(hits, misses, evicted, node)

    # ------------------------------------------------------------------ introspection (tests, debugging)
    def path_key(self, node: Node) -> bytes:
        """Bytes of the whole path root..node."""
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.key[: node.n << 2])
            node = node.parent
        return b"".join(reversed(parts))

    def iter_nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def iter_evictable_leaves(self) -> Iterator[Node]:
        for node in self.iter_nodes():
            if not node.children and node.lock_ref == 0:
                yield node

    def cached_keys(self) -> set[bytes]:
        """Every cached token as its path-prefix bytes (O(total tokens); for tests)."""
        out = set()
        for node in self.iter_nodes():
            full = self.path_key(node)
            for i in range(node.n):
                out.add(full[: len(full) - 4 * i])
        return out

    def check_invariants(self) -> None:
        """O(size) consistency check; raises AssertionError naming the broken invariant."""
        total = evictable = protected = count = 0
        assert self.root.lock_ref == 1, "root lock_ref changed"
        for node in self.iter_nodes():
            count += 1
            assert node.n >= 1, "empty node"
            assert len(node.key) >= node.n << 2, "key shorter than n"
            parent = node.parent
            assert parent is not None and parent.children.get(node.key[:4]) is node, "broken parent link"
            assert node.depth == parent.depth + node.n, "depth mismatch"
            if parent is not self.root:
                assert parent.lock_ref >= node.lock_ref, "a locked node below an unlocked parent"
            assert node.lock_ref >= 0, "negative lock_ref"
            total += node.n
            if node.lock_ref:
                protected += node.n
            else:
                evictable += node.n
        assert count == self._num_nodes, f"node count {self._num_nodes} != {count}"
        assert total == self._total, f"total_size {self._total} != {total}"
        assert evictable == self._evictable, f"evictable_size {self._evictable} != {evictable}"
        assert protected == self._protected, f"protected_size {self._protected} != {protected}"
        assert evictable + protected == total, "evictable + protected != total"
        assert total <= self._capacity, f"total {total} > capacity {self._capacity}"
        self.policy.check()
