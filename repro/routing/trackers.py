"""LBGR's approximate cache tracker: per-worker eviction state, one shared prefix index for lookups.

What the tracker answers (docs/ALGORITHMS.md §3, LBGR "Tracker"): for a prompt key and EVERY
worker i, h_i = the longest prefix of the key in C_i (worker i's tracked cache: a RadixCache of the
worker's capacity and eviction policy) or in I_i (the prompts in flight on worker i).
Both sets are prefix-closed, so h_i = the longest prefix of the key in C_i u I_i.

Why two structures: eviction is per worker and (RLT) random, so each worker keeps its own
RadixCache, updated once per request (on completion, or on dispatch for tracker_update
"dispatch"); but a routing decision needs h_i for all M workers, and M peeks cost M walks.
`SharedPrefixIndex` is one radix tree over the union of all workers' C_i u I_i whose nodes say
which workers hold them (a bitmask), kept in sync with the caches through their eviction
listener; a decision walks it once, in O(prompt nodes + holders), flat in M.

Invariant: within one index node every worker holds all of its tokens or none (nodes are split
wherever a worker's holding ends), so "worker i holds node n" is one bit. Holder sets shrink
going down a path (prefix-closed), and a node nobody holds is unlinked with its subtree.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from repro.kvcache import RadixCache, common_prefix_len


def tracker_access(cache, key: bytes) -> int:
    """Access `key` (packed int32) in a tracker cache the way an SGLang worker would.

    match_prefix (an access), lock the matched path, evict what the new tokens need, unlock,
    insert whatever fits. Returns the number of tokens now cached on the path (the path cut to
    capacity): key[:4 * returned] is entirely in the cache afterwards.
    """
    n = min(len(key) // 4, cache.capacity_tokens)
    key = key[: 4 * n]
    match = cache.match_prefix(key)
    cache.inc_lock_ref(match.last_node)
    need = (n - match.length) - cache.free_tokens()
    if need > 0:
        cache.evict(need)
    cache.dec_lock_ref(match.last_node)
    fit = min(n, match.length + cache.free_tokens())
    if isinstance(cache, RadixCache):  # the same access as insert(key[:4 * fit]), without a second walk
        cache.insert_after(match.last_node, key[4 * match.length : 4 * fit], 0)  # inserted_len 0, as insert
    else:
        cache.insert(key[: 4 * fit])
    return fit


def finished_path(key: bytes, full_key: bytes) -> bytes:
    """What a worker caches of a finished request's path `full_key` (prompt `key` + its reply):
    everything but the reply's last token, whose KV is never computed."""
    return full_key[:-4] if len(full_key) > len(key) else full_key


def listen_evictions(cache, listener: Callable[[bytes, int], None]) -> None:
    """Make `cache` call listener(path_key, kept_tokens) before each eviction: the tokens of the
    path `path_key` (packed int32, ending at the evicted leaf's end) deeper than `kept_tokens`
    are about to leave the cache.

    A repro.kvcache RadixCache reports through its eviction hook (same victims as without it);
    any other cache (test doubles) must have an `eviction_listener` attribute it calls itself.
    """
    if isinstance(cache, RadixCache):
        path_key = cache.path_key

        def hook(node, r: int) -> None:
            listener(path_key(node), node.depth - r)

        cache.debug_on_evict = hook
    elif hasattr(cache, "eviction_listener"):
        cache.eviction_listener = listener
    else:
        raise TypeError(
            f"an approximate-tracker cache must report its evictions (a repro.kvcache RadixCache, or an "
            f"`eviction_listener` attribute it calls); {type(cache).__name__} has neither"
        )


class _Node:
    __slots__ = ("key", "children", "parent", "cmask", "imask", "mask", "inflight")

    def __init__(self, key: bytes, parent: "_Node | None") -> None:
        self.key = key  # packed int32 run (never empty except the root)
        self.children: dict[bytes, _Node] = {}  # first token (4 bytes) -> child
        self.parent = parent
        self.cmask = 0  # workers whose tracked cache holds this node
        self.imask = 0  # workers with a prompt in flight through this node
        self.mask = 0  # cmask | imask
        self.inflight: dict[int, int] = {}  # worker -> prompts in flight through this node


class SharedPrefixIndex:
    """One radix tree over packed int32 keys; each node carries the workers that hold it
    (tracked cache and / or in-flight prompts). See the module docstring.

    hits(key) -> [h_0, .., h_{M-1}] in one walk. add_inflight / remove_inflight: a prompt
    dispatched to / leaving a worker. add_cached(key, n, w): key[:n tokens] is now in w's
    cache. remove_cached(path_key, kept, w): w's cache drops the path's tokens deeper than
    `kept` (its eviction listener). Nodes are never merged back (extra split points are harmless).
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.root = _Node(b"", None)
        self.root.mask = (1 << num_workers) - 1
        self.inflight_size = 0  # prompts in flight
        self._idx: dict[int, np.ndarray] = {}
        self._walked: tuple | None = None  # (key, full nodes, bytes, partial node, its bytes) of levels()

    # ------------------------------------------------------------------ lookups
    def levels(self, key: bytes) -> list[tuple[int, int]]:
        """The holders along key's path, one walk: [(t_1, mask_1), ..., (t_k, mask_k)], t
        increasing, masks strictly nested (mask_{j+1} a proper subset of mask_j, none empty):
        worker i's hit is t_j for the last j with bit i in mask_j (0 if in none)."""
        out: list[tuple[int, int]] = []
        children = self.root.children
        pos, n = 0, len(key)
        prev = 0
        path = []
        partial, k = None, 0
        while pos < n:
            child = children.get(key[pos : pos + 4])
            if child is None:
                break
            ck = child.key
            mask = child.mask
            if mask != prev and prev:
                out.append((pos >> 2, prev))  # prev's holders end where this node starts
            prev = mask
            if key.startswith(ck, pos):
                pos += len(ck)
                children = child.children
                path.append(child)
            else:
                partial, k = child, common_prefix_len(key, pos, ck)
                break
        # kept for an add_inflight of this very key next (a decision's dispatch): no second walk
        self._walked = (key, path, pos, partial, k)
        if prev:
            out.append(((pos + k) >> 2, prev))
        return out

    def hits(self, key: bytes) -> list[int]:
        """h_i for every worker i (0 where it holds nothing of the key)."""
        out = [0] * self.num_workers
        lv = self.levels(key)
        for j, (t, mask) in enumerate(lv):
            if j + 1 < len(lv):
                mask &= ~lv[j + 1][1]  # the holders whose hit ends here
            while mask:
                low = mask & -mask
                out[low.bit_length() - 1] = t
                mask ^= low
        return out

    def holders(self, mask: int) -> "np.ndarray":
        """The workers of a holder mask as an index array (memoised: the same masks recur)."""
        idx = self._idx.get(mask)
        if idx is None:
            if len(self._idx) > 4096:
                self._idx.clear()
            bits = []
            m = mask
            while m:
                low = m & -m
                bits.append(low.bit_length() - 1)
                m ^= low
            idx = self._idx[mask] = np.array(bits, dtype=np.intp)
        return idx

    def inflight_hits(self, key: bytes) -> list[int]:
        """Per worker, the longest common prefix of `key` with its in-flight prompts only (tests)."""
        out = [0] * self.num_workers
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + 4])
            if child is None:
                break
            full = key.startswith(child.key, pos)
            pos += len(child.key) if full else common_prefix_len(key, pos, child.key)
            for w in child.inflight:
                out[w] = pos >> 2
            if not full:
                break
            node = child
        return out

    # ------------------------------------------------------------------ structure
    def _path(self, key: bytes, create: bool) -> list[_Node]:
        """The nodes covering key exactly (split / created so that one ends at len(key))."""
        node, pos, n = self.root, 0, len(key)
        path = []
        while pos < n:
            first = key[pos : pos + 4]
            child = node.children.get(first)
            if child is None:
                if not create:
                    raise KeyError("SharedPrefixIndex: path not in the index")
                child = _Node(key[pos:], node)
                node.children[first] = child
            else:
                ck = child.key
                if not key.startswith(ck, pos):  # diverges or ends inside: split there
                    child = self._split(child, common_prefix_len(key, pos, ck))
            path.append(child)
            pos += len(child.key)
            node = child
        return path

    @staticmethod
    def _split(child: _Node, kb: int) -> _Node:
        """Split `child` after its first kb bytes; returns the new upper node (same holders)."""
        ck = child.key
        parent = child.parent
        upper = _Node(ck[:kb], parent)
        upper.cmask, upper.imask, upper.mask = child.cmask, child.imask, child.mask
        if child.inflight:
            upper.inflight = dict(child.inflight)
        rest = ck[kb:]
        upper.children[rest[:4]] = child
        child.key = rest
        child.parent = upper
        parent.children[ck[:4]] = upper
        return upper

    @staticmethod
    def _unlink(node: _Node) -> None:
        """Cut node's subtree off the tree. Its parent links are cleared so that reference
        counting frees it at once: a child<->parent cycle waits for a full GC pass, rare with
        millions of live objects, and such garbage had piled up to ~400k objects in a cell."""
        del node.parent.children[node.key[:4]]
        stack = [node]
        while stack:
            x = stack.pop()
            x.parent = None
            stack.extend(x.children.values())

    # ------------------------------------------------------------------ updates
    def _path_after_levels(self, key: bytes) -> list[_Node] | None:
        """_path(key, True) from the walk of the last levels(key) (None if the index changed since)."""
        walked = self._walked
        if walked is None or walked[0] is not key:
            return None
        _, path, pos, partial, k = walked
        node = path[-1] if path else self.root
        if partial is not None:
            node = self._split(partial, k)
            path.append(node)
            pos += k
        if pos < len(key):
            child = _Node(key[pos:], node)
            node.children[key[pos : pos + 4]] = child
            path.append(child)
        return path

    def add_inflight(self, key: bytes, worker: int) -> None:
        bit = 1 << worker
        path = self._path_after_levels(key)
        self._walked = None
        for node in self._path(key, True) if path is None else path:
            fl = node.inflight
            fl[worker] = fl.get(worker, 0) + 1
            node.imask |= bit
            node.mask |= bit
        self.inflight_size += 1

    def remove_inflight(self, key: bytes, worker: int) -> None:
        """Remove one in-flight prompt `key` of `worker` (it must have been added)."""
        self._walked = None
        bit = ~(1 << worker)
        gone = None
        for node in self._path(key, False):
            fl = node.inflight
            c = fl[worker] - 1
            if c:
                fl[worker] = c
            else:
                del fl[worker]
                node.imask &= bit
                node.mask = node.cmask | node.imask
                if not node.mask and gone is None:
                    gone = node  # nobody holds it: neither anything below
        if gone is not None:
            self._unlink(gone)
        self.inflight_size -= 1

    def add_cached(self, key: bytes, tokens: int, worker: int) -> None:
        """key[:tokens] is now entirely in `worker`'s tracked cache."""
        self._walked = None
        if tokens <= 0:
            return
        bit = 1 << worker
        for node in self._path(key[: tokens << 2], True):
            node.cmask |= bit
            node.mask |= bit

    def complete(self, key: bytes, full: bytes, tokens: int, worker: int, inflight: bool) -> None:
        """One walk for a completion: (if `inflight`) the prompt `key` of `worker` leaves the
        in-flight prompts, and full[:tokens] (full = key + generated tokens) is now entirely in
        `worker`'s tracked cache. Same holders as remove_inflight then add_cached."""
        self._walked = None
        bit = 1 << worker
        keep = ~bit
        pb = len(key) if inflight else 0
        fb = tokens << 2
        end = pb if pb > fb else fb
        node, pos = self.root, 0
        gone = None
        while pos < end:
            first = full[pos : pos + 4]
            child = node.children.get(first)
            if child is None:  # beyond the prompt's in-flight path: the rest of the cached part is new
                child = _Node(full[pos:fb], node)
                node.children[first] = child
            elif pos < fb:  # a node must end where the cached part does (or where full diverges)
                ck = child.key
                if not full.startswith(ck, pos):
                    k = common_prefix_len(full, pos, ck)
                    child = self._split(child, k if k < fb - pos else fb - pos)
                elif pos + len(ck) > fb:
                    child = self._split(child, fb - pos)
            nend = pos + len(child.key)
            if nend <= fb:
                child.cmask |= bit
            if pos < pb:  # on the prompt's path (whose nodes end at len(key)): one fewer in flight
                fl = child.inflight
                c = fl[worker] - 1
                if c:
                    fl[worker] = c
                else:
                    del fl[worker]
                    child.imask &= keep
            child.mask = child.cmask | child.imask
            if not child.mask and gone is None:
                gone = child  # nobody holds it: neither anything below
            pos = nend
            node = child
        if gone is not None:
            self._unlink(gone)
        if inflight:
            self.inflight_size -= 1

    def remove_cached(self, path_key: bytes, kept: int, worker: int) -> None:
        """`worker`'s tracked cache drops the tokens of `path_key` deeper than `kept` tokens
        (path_key ends at an evicted leaf of that cache, so it holds nothing deeper)."""
        self._walked = None
        bit = 1 << worker
        node, pos, n = self.root, 0, len(path_key)
        cut = kept << 2
        gone = None
        while pos < n:
            child = node.children[path_key[pos : pos + 4]]
            end = pos + len(child.key)
            if end > n or not path_key.startswith(child.key, pos):
                raise RuntimeError(
                    "SharedPrefixIndex out of sync with a tracked cache (no node ends at the evicted leaf)"
                )
            if end > cut:
                if pos < cut:
                    self._split(child, cut - pos)
                    pos = cut
                    node = child.parent
                    continue
                child.cmask &= ~bit
                child.mask = child.cmask | child.imask
                if not child.mask and gone is None:
                    gone = child
            pos = end
            node = child
        if gone is not None:
            self._unlink(gone)

    def num_nodes(self) -> int:
        count, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count


class ApproximateTracker:
    """Per-worker tracked caches + the shared index that answers all workers' hits at once.

    `caches[i]` is worker i's RadixCache (built by `make_cache(capacity, eviction_cfg, seed)`);
    with `inflight` the prompts in flight are tracked too (tracker_update "inflight"), else a
    prompt is a cache access on dispatch (tracker_update "dispatch").
    """

    def __init__(self, caches: list, inflight: bool) -> None:
        self.caches = caches
        self.index = SharedPrefixIndex(len(caches))
        self.track_inflight = bool(inflight)
        for w, cache in enumerate(caches):
            listen_evictions(cache, self._evict_listener(w))

    def _evict_listener(self, worker: int):
        remove = self.index.remove_cached

        def listener(path_key: bytes, kept: int) -> None:
            remove(path_key, kept, worker)

        return listener

    def hits(self, key: bytes) -> list[int]:
        return self.index.hits(key)

    def dispatched(self, key: bytes, worker: int) -> None:
        if self.track_inflight:
            self.index.add_inflight(key, worker)
        else:
            self.index.add_cached(key, tracker_access(self.caches[worker], key), worker)

    def completed(self, key: bytes, full_key: bytes, worker: int) -> None:
        """The prompt `key` finished on `worker`; `full_key` = prompt + generated tokens.

        The worker caches all but the last generated token (SGLang never feeds the last sampled
        token forward, so it has no KV: prompt + output - 1; docs/ALGORITHMS.md §7).
        """
        full_key = finished_path(key, full_key)
        fit = tracker_access(self.caches[worker], full_key)
        self.index.complete(key, full_key, fit, worker, self.track_inflight)

    def abandoned(self, key: bytes, worker: int) -> None:
        if self.track_inflight:
            self.index.remove_inflight(key, worker)
