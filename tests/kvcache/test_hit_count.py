"""lfu / slru (repro/kvcache/eviction/hit_count.py) against a token-level reference written here.

The reference keeps, per cached token (its path prefix), SGLang's hit count and the position of
its latest access, and evicts one unlocked leaf token at a time with the smallest key: lfu =
(count, position), slru = (count >= threshold, position). At token granularity our tree must
evict exactly those tokens; at node granularity it evicts whole nodes (checked for invariants
and that counts never fall). The sequences are the simulator's: match, lock, chunked inserts
(inserted_len 0 first, then the previous chunk's end), a finish inserting the output.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repro.kvcache import as_key, check_eviction_config, make_cache


class RefTree:
    def __init__(self, capacity: int, policy: str, threshold: int = 2):
        self.capacity, self.policy, self.threshold = capacity, policy, threshold
        self.count: dict[tuple, int] = {}
        self.pos: dict[tuple, int] = {}
        self.locks: dict[tuple, int] = {}
        self.clock = 0

    def free(self) -> int:
        return self.capacity - len(self.count)

    def _access(self, toks: tuple, n: int) -> None:
        for d in range(1, n + 1):
            self.pos[toks[:d]] = self.clock + d
        self.clock += n

    def match(self, toks) -> tuple[int, tuple]:
        toks = tuple(int(t) for t in toks)
        m = 0
        while m < len(toks) and toks[: m + 1] in self.count:
            m += 1
        self._access(toks, m)
        return m, toks[:m]

    def insert(self, toks, end: int, inserted_len: int) -> tuple:
        toks = tuple(int(t) for t in toks[:end])
        for d in range(1, end + 1):
            p = toks[:d]
            self.count[p] = self.count.get(p, 0) + (1 if d > inserted_len else 0)
        self._access(toks, end)
        return toks

    def lock(self, h: tuple, by: int) -> None:
        for d in range(1, len(h) + 1):
            self.locks[h[:d]] = self.locks.get(h[:d], 0) + by

    def _key(self, p: tuple):
        c = self.count[p]
        return (c if self.policy == "lfu" else int(c >= self.threshold), self.pos[p])

    def evict(self, n: int) -> int:
        got = 0
        while got < n:
            children = {p[:-1] for p in self.count}
            leaves = [p for p in self.count if p not in children and not self.locks.get(p)]
            if not leaves:
                break
            victim = min(leaves, key=self._key)
            del self.count[victim], self.pos[victim]
            got += 1
        return got

    def cached(self) -> set[bytes]:
        return {as_key(np.asarray(p, dtype=np.int64)) for p in self.count}


class OursSide:
    def __init__(self, capacity: int, policy: str, granularity: str, threshold: int = 2):
        cfg = {"name": policy, "granularity": granularity}
        if policy == "slru":
            cfg["protected_threshold"] = threshold
        self.cache = make_cache(capacity, cfg, 0)

    def free(self) -> int:
        return self.cache.free_tokens()

    def match(self, toks):
        r = self.cache.match_prefix(as_key(np.asarray(toks, dtype=np.int64)))
        return r.length, r.last_node

    def insert(self, toks, end, inserted_len, base):
        tail = as_key(np.asarray(toks[base.depth : end], dtype=np.int64))
        return self.cache.insert_after(base, tail, inserted_len).last_node

    def lock(self, h, by: int) -> None:
        (self.cache.inc_lock_ref if by > 0 else self.cache.dec_lock_ref)(h)

    def evict(self, n: int) -> int:
        return self.cache.evict(n)

    def cached(self) -> set[bytes]:
        return self.cache.cached_keys()


def drive(side, prompts, outputs, chunk: int, in_flight: int, on_evict) -> list[int]:
    """The simulator's sequence (see the module docstring); returns the matched lengths."""
    ref = isinstance(side, RefTree)
    matched, running = [], []

    def room(n: int) -> bool:
        if n > side.free():
            on_evict(side, side.evict(n - side.free()))
        return n <= side.free()

    def insert(toks, end, ins_len, base):
        return side.insert(toks, end, ins_len) if ref else side.insert(toks, end, ins_len, base)

    def finish(req) -> None:
        full, plen, h = req
        if h is not None:
            if room(len(full) - plen):
                insert(full, len(full), plen, h)
            side.lock(h, -1)

    for toks, out in zip(prompts, outputs):
        full = np.concatenate([toks, out]).astype(np.int64)
        m, h = side.match(toks)
        matched.append(m)
        side.lock(h, 1)
        done, ins_len = m, 0
        while done < len(toks):
            end = min(len(toks), done + chunk)
            if not room(end - done):
                side.lock(h, -1)
                h = None
                break
            last = insert(full, end, ins_len, h)
            side.lock(last, 1)
            side.lock(h, -1)
            h, done, ins_len = last, end, end
        running.append((full, len(toks), h))
        while len(running) > in_flight:
            finish(running.pop(0))
    for req in running:
        finish(req)
    return matched


def _workload(seed: int, n: int, vocab: int):
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, vocab, int(rng.integers(1, 6))) for _ in range(4)]
    prompts = [
        np.concatenate([stems[int(rng.integers(0, 4))], rng.integers(0, vocab, int(rng.integers(1, 5)))])
        for _ in range(n)
    ]
    outputs = [rng.integers(0, vocab, int(rng.integers(0, 4))) for _ in prompts]
    return prompts, outputs


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(["lfu", "slru"]),
    threshold=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    capacity=st.integers(12, 40),
    chunk=st.integers(1, 5),
    in_flight=st.integers(1, 3),
    vocab=st.integers(2, 4),
)
def test_token_granularity_evicts_the_reference_tokens(policy, threshold, seed, capacity, chunk, in_flight, vocab):
    prompts, outputs = _workload(seed, 40, vocab)
    logs: dict[str, list] = {"ref": [], "ours": []}

    def record(name):
        def on_evict(side, got):
            logs[name].append((got, frozenset(side.cached())))

        return on_evict

    ref = RefTree(capacity, policy, threshold)
    ours = OursSide(capacity, policy, "token", threshold)
    a = drive(ref, prompts, outputs, chunk, in_flight, record("ref"))
    b = drive(ours, prompts, outputs, chunk, in_flight, record("ours"))
    ours.cache.check_invariants()
    first = next((i for i, (x, y) in enumerate(zip(logs["ref"], logs["ours"])) if x != y), None)
    assert first is None, f"evict call {first} differs"
    assert len(logs["ref"]) == len(logs["ours"]) and a == b


@pytest.mark.parametrize("policy", ["lfu", "slru"])
def test_node_granularity_keeps_invariants_and_protects_hot_prefixes(policy):
    prompts, outputs = _workload(3, 400, 6)
    ours = OursSide(60, policy, "node")
    drive(ours, prompts, outputs, 3, 2, lambda side, got: side.cache.check_invariants())
    ours.cache.check_invariants()
    # a prefix every request inserts through is counted once per request (inserted_len): hot
    hot = make_cache(20, {"name": policy}, 0)
    for i in range(5):
        r = hot.insert(as_key(np.array([1, 2, 3, 10 + i])))
    cold = hot.insert(as_key(np.array([7, 8]))).last_node
    assert r.last_node.parent.state == 5 and cold.state == 1
    hot.evict(1)  # among the hit-once leaves the oldest goes: [10] below [1, 2, 3]
    assert hot.peek_prefix(as_key(np.array([1, 2, 3, 10]))) == 3
    assert hot.peek_prefix(as_key(np.array([1, 2, 3, 11]))) == 4 and hot.peek_prefix(as_key(np.array([7, 8]))) == 2


def test_a_chunk_continuing_its_request_counts_only_past_inserted_len():
    c = make_cache(20, {"name": "lfu"}, 0)
    first = c.insert_after(c.root, as_key(np.array([1, 2])), 0).last_node
    c.inc_lock_ref(first)
    nxt = c.insert_after(first, as_key(np.array([3, 4]))).last_node  # default inserted_len = depth 2
    assert (first.state, nxt.state) == (1, 1)
    c.insert_after(first, as_key(np.array([3, 4])), 0)  # another request's first chunk: the whole path
    assert (first.state, nxt.state) == (2, 2)
    c.match_prefix(as_key(np.array([1, 2, 3, 4])))  # matches never count (SGLang)
    assert (first.state, nxt.state) == (2, 2)


def test_bad_parameters_are_rejected_before_work():
    assert check_eviction_config({"name": "slru", "protected_threshold": 2}, "sglang") == []
    assert check_eviction_config({"name": "lfu", "granularity": "token"}, "sglang")  # SGLang evicts nodes
    assert check_eviction_config({"name": "lfu", "protected_threshold": 2})  # lfu has no parameters
    with pytest.raises(ValueError, match="protected_threshold"):
        make_cache(10, {"name": "slru", "protected_threshold": "2"}, 0)


def test_the_live_path_runs_sglangs_own_flag_with_the_configs_parameters():
    from repro.backends.sglang.commands import sglang_eviction_policy_config, sglang_server_command

    def cmd(ev):
        return sglang_server_command(
            "py",
            "m",
            "h",
            1,
            ev["name"],
            {},
            kv_cache_tokens=64,
            mem_fraction=None,
            eviction_policy_config=sglang_eviction_policy_config(ev),
        )

    slru = cmd({"name": "slru", "granularity": "node", "protected_threshold": 3})
    i = slru.index("--radix-eviction-policy")
    assert (
        slru[i + 1] == "slru" and slru[slru.index("--radix-eviction-policy-config") + 1] == '{"protected_threshold": 3}'
    )
    lfu = cmd({"name": "lfu", "granularity": "node"})
    assert lfu[lfu.index("--radix-eviction-policy") + 1] == "lfu" and "--radix-eviction-policy-config" not in lfu


def test_a_tracker_access_counts_as_the_insert_it_stands_for():
    from repro.routing.trackers import tracker_access

    rng = np.random.default_rng(4)
    a, b = make_cache(40, {"name": "lfu"}, 0), make_cache(40, {"name": "lfu"}, 0)
    for _ in range(200):
        key = as_key(np.concatenate([[1, 2], rng.integers(0, 3, int(rng.integers(1, 6)))]))
        tracker_access(a, key)
        m = b.match_prefix(key)
        b.inc_lock_ref(m.last_node)
        need = (len(key) // 4 - m.length) - b.free_tokens()
        if need > 0:
            b.evict(need)
        b.dec_lock_ref(m.last_node)
        b.insert(key)
        assert a.cached_keys() == b.cached_keys()
    counts = {a.path_key(n): n.state for n in a.iter_nodes()}
    assert counts == {b.path_key(n): n.state for n in b.iter_nodes()}
