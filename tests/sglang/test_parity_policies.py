"""Parity with SGLang 0.5.23's own `lfu` and `slru` strategies (marker `sglang`): the same request
sequence on SGLang's RadixCache (built with `eviction_policy=lfu|slru`) and on our tree
(repro.kvcache.eviction.hit_count) evicts the same tokens at every step.

The sequence is the simulator's per request, with SGLang's `inserted_len` made explicit: match the
prompt, lock it, insert its uncached part in chunks (the first chunk with inserted_len 0, each next
one with the previous chunk's end), lock the end; `in_flight` requests later the request finishes:
its output is inserted with inserted_len = the prompt's length, then the path is unlocked. Our
tree runs the same calls as `insert_after(lock, chunk, inserted_len)`, as the simulator does.
After every evict the cached token sets of both trees are compared (so: the same evicted tokens).

    .venv-sglang/bin/python -m pytest -m sglang tests/sglang/test_parity_policies.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sglang.sglang_driver import OursTree, SGLangTree, deterministic_clock, prefix_tree_trace

pytestmark = pytest.mark.sglang

POLICIES = ("lfu", "slru")


def _sg_cached(tree) -> set[bytes]:
    from repro.kvcache import as_key

    out = set()
    stack = [(c, []) for c in tree.root.children.values()]
    while stack:
        node, above = stack.pop()
        toks = above + list(node.key.token_ids[: len(node.key)])
        for i in range(len(above) + 1, len(toks) + 1):
            out.add(as_key(np.asarray(toks[:i], dtype=np.int64)))
        stack.extend((c, toks) for c in node.children.values())
    return out


class _Side:
    """One tree behind the verbs the sequence needs; `ours` picks the call shapes."""

    def __init__(self, tree, ours: bool):
        self.t = tree
        self.ours = ours

    def free(self) -> int:
        return self.t.free_tokens()

    def match(self, toks):
        if self.ours:
            r = self.t.cache.match_prefix(self.t.key_of(toks))
            return r.length, r.last_node
        return self.t.match_prefix(toks)

    def insert(self, toks, end: int, inserted_len: int, base):
        """Insert toks[:end] (base: our locked node ending at the request's previous insert)."""
        if self.ours:
            return self.t.cache.insert_after(base, self.t.key_of(toks[base.depth : end]), inserted_len).last_node
        sg = self.t.sg
        key = sg.RadixKey(self.t.key_of(toks[:end]))
        return self.t.cache.insert(sg.InsertParams(key=key, value=None, inserted_len=inserted_len)).last_device_node

    def cached(self) -> set[bytes]:
        return self.t.cache.cached_keys() if self.ours else _sg_cached(self.t)


def run_chunked(side: _Side, trace, outputs, chunk: int, in_flight: int, log: list) -> dict:
    """The sequence in the module docstring; `log` gets the evicted token set of every evict call."""
    matched, skipped, evicted = [], 0, 0

    def evict(need: int) -> None:
        nonlocal evicted
        before = side.cached()
        got = side.t.evict(need)
        evicted += got
        gone = before - side.cached()
        assert sum(1 for _ in gone) == got
        log.append(frozenset(gone))

    def room(n: int) -> bool:
        if n > side.free():
            evict(n - side.free())
        return n <= side.free()

    running: list = []

    def finish(req) -> None:
        toks, plen, node = req
        if node is None:
            return
        if room(len(toks) - plen):
            side.insert(toks, len(toks), plen, node)
        side.t.dec_lock_ref(node)

    for toks, out in zip(trace, outputs):
        full = np.concatenate([toks, out]).astype(np.int64)
        plen = len(toks)
        m, node = side.match(toks)
        matched.append(m)
        side.t.inc_lock_ref(node)
        done, ins_len, ok = m, 0, True
        while done < plen:
            end = min(plen, done + chunk)
            if not room(end - done):
                ok = False
                break
            last = side.insert(full, end, ins_len, node)
            side.t.inc_lock_ref(last)
            side.t.dec_lock_ref(node)
            node, done, ins_len = last, end, end
        if not ok:
            side.t.dec_lock_ref(node)
            skipped += 1
            node = None
        running.append((full, plen, node))
        while len(running) > in_flight:
            finish(running.pop(0))
    for req in running:
        finish(req)
    return {"matched": matched, "skipped": skipped, "evicted": evicted}


def _both(sg, policy, trace, outputs, capacity, chunk, in_flight):
    with deterministic_clock(sg):
        theirs, log_t = SGLangTree(sg, capacity, policy), []
        a = run_chunked(_Side(theirs, False), trace, outputs, chunk, in_flight, log_t)
    ours, log_o = OursTree(capacity, policy), []
    b = run_chunked(_Side(ours, True), trace, outputs, chunk, in_flight, log_o)
    ours.cache.check_invariants()
    return a, b, log_t, log_o


def _assert_same(a, b, log_t, log_o):
    first = next((i for i, (x, y) in enumerate(zip(log_t, log_o)) if x != y), None)
    assert first is None, f"evict call {first}: SGLang evicted {len(log_t[first])} tokens, ours {len(log_o[first])}"
    assert len(log_t) == len(log_o)
    assert a == b


def _trace(seed, n, vocab=5, depth=5, segment=(1, 8)):
    rng = np.random.default_rng(seed)
    prompts = prefix_tree_trace(rng, n, branching=3, depth=depth, segment_tokens=segment, vocab=vocab)
    outputs = [rng.integers(0, vocab, size=int(rng.integers(0, 5))) for _ in prompts]
    return prompts, outputs


def test_sglang_strategies_are_the_ones_read(sg):
    from sglang.srt.mem_cache import evict_policy

    assert sg.version == "0.5.23"
    assert evict_policy.SLRUStrategy().protected_threshold == 2  # conf/eviction/slru.yaml's default


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("in_flight,chunk", [(1, 1000), (3, 4)])
def test_policy_matches_sglang_step_by_step(sg, policy, seed, in_flight, chunk):
    trace, outputs = _trace(seed, 250)
    a, b, log_t, log_o = _both(sg, policy, trace, outputs, 50 + 10 * seed, chunk, in_flight)
    assert len(log_t) > 30 and a["evicted"] > 100  # eviction matters
    _assert_same(a, b, log_t, log_o)


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_matches_sglang_on_a_gsp_like_trace(sg, policy):
    rng = np.random.default_rng(7)
    prefixes = [rng.integers(0, 1000, 64) for _ in range(8)]
    weights = np.array([8, 4, 2, 1, 1, 1, 1, 1], float)
    groups = rng.choice(8, size=200, p=weights / weights.sum())
    trace = [np.concatenate([prefixes[g], rng.integers(0, 1000, 16)]) for g in groups]
    outputs = [rng.integers(0, 1000, 8) for _ in trace]
    a, b, log_t, log_o = _both(sg, policy, trace, outputs, 400, 32, 3)
    assert a["evicted"] > 1000
    _assert_same(a, b, log_t, log_o)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 2**31 - 1),
    capacity=st.integers(10, 60),
    chunk=st.integers(1, 6),
    in_flight=st.integers(1, 3),
    vocab=st.integers(2, 4),
)
def test_policy_parity_property(sg, policy, seed, capacity, chunk, in_flight, vocab):
    trace, outputs = _trace(seed, 60, vocab=vocab, depth=4, segment=(1, 5))
    a, b, log_t, log_o = _both(sg, policy, trace, outputs, capacity, chunk, in_flight)
    _assert_same(a, b, log_t, log_o)
