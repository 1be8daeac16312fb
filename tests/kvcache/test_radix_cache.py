"""Unit tests of RadixCache's verbs, errors and the policy factory (the contract in repro/kvcache/__init__.py)."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from repro.kvcache import (
    CapacityError,
    LRUEviction,
    RadixCache,
    RLTEviction,
    as_key,
    make_cache,
    make_eviction,
)

ROOT = Path(__file__).resolve().parents[2]


def lru(cap, gran="token"):
    return make_cache(cap, {"name": "lru", "granularity": gran})


# ---------------------------------------------------------------- keys
def test_as_key_accepts_all_token_forms():
    want = np.array([1, -2, 3], dtype=np.int32).tobytes()
    assert as_key([1, -2, 3]) == want
    assert as_key((1, -2, 3)) == want
    assert as_key(np.array([1, -2, 3], dtype=np.int64)) == want
    assert as_key(np.array([1, -2, 3], dtype=np.int32)) == want
    assert as_key(want) == want
    assert as_key(bytearray(want)) == want
    assert as_key([]) == b""


@pytest.mark.parametrize(
    "bad, msg",
    [
        (b"abc", "multiple of 4"),
        ([1.5, 2.0], "integer"),
        ([[1, 2]], "one-dimensional"),
        ([2**31], "int32"),
    ],
)
def test_as_key_rejects_bad_tokens(bad, msg):
    with pytest.raises(ValueError, match=msg):
        as_key(bad)


# ---------------------------------------------------------------- verbs
def test_match_insert_split_and_sizes():
    c = lru(100)
    r = c.insert([1, 2, 3, 4])
    assert r.prefix_len == 0 and c.total_size() == 4 and c.evictable_size() == 4
    m = c.match_prefix([1, 2, 9])
    assert m.length == 2 and m.last_node.depth == 2  # split at the match boundary
    assert c.stats()["num_nodes"] == 2
    r = c.insert([1, 2, 7, 8, 9])
    assert r.prefix_len == 2 and r.last_node.depth == 5 and c.total_size() == 7
    assert c.peek_prefix([1, 2, 3, 4, 5]) == 4
    assert c.peek_prefix([1, 2, 7]) == 3  # ends inside a node: no split needed to answer
    assert c.peek_prefix([5]) == 0
    r = c.insert([1, 2, 3, 4])
    assert r.prefix_len == 4 and c.total_size() == 7
    c.check_invariants()


def test_insert_raises_capacity_error_and_changes_nothing():
    c = lru(5)
    c.insert([1, 2, 3])
    before = (c.total_size(), c.clock, c.stats()["num_nodes"])
    with pytest.raises(CapacityError, match="evict"):
        c.insert([1, 9, 9, 9, 9])  # 4 new tokens, 2 free
    assert (c.total_size(), c.clock, c.stats()["num_nodes"]) == before
    c.check_invariants()


def test_lock_protects_and_returns_protected_delta():
    c = lru(10)
    r = c.insert([1, 2, 3, 4])
    assert c.inc_lock_ref(r.last_node) == 4
    assert c.inc_lock_ref(r.last_node) == 0  # already protected
    assert c.protected_size() == 4 and c.evictable_size() == 0
    assert c.evict(4) == 0
    assert c.dec_lock_ref(r.last_node) == 0
    assert c.dec_lock_ref(r.last_node) == -4
    with pytest.raises(ValueError, match="below zero"):
        c.dec_lock_ref(r.last_node)
    assert c.evict(4) == 4 and c.total_size() == 0
    c.check_invariants()


def test_token_granularity_evicts_exactly_node_granularity_whole_nodes():
    for gran, want in (("token", 3), ("node", 4)):
        c = lru(10, gran)
        c.insert([1, 2, 3, 4])
        assert c.evict(3) == want, gran
        assert c.evicted_tokens == want
        c.check_invariants()


def test_lru_evicts_least_recent_leaf_first():
    c = lru(100, "node")
    c.insert([1, 1])
    c.insert([2, 2])
    c.insert([3, 3])
    c.match_prefix([1, 1])  # 1,1 becomes most recent
    c.evict(1)
    assert c.peek_prefix([2, 2]) == 0 and c.peek_prefix([1, 1]) == 2 and c.peek_prefix([3, 3]) == 2


def test_token_lru_is_token_by_token_across_nodes():
    c = lru(100, "token")
    c.insert([1, 1, 1])  # positions 1..3
    c.insert([2, 2])  # positions 4..5
    c.match_prefix([1])  # token (1,) now at 6, but (1,1,1) still older than (2,2)
    assert c.evict(3) == 3
    # victims: (1,1,1), (1,1), then (2,2) (older than (1,) which was re-accessed)
    assert c.peek_prefix([1, 1, 1]) == 1 and c.peek_prefix([2, 2]) == 1


def test_node_granularity_stamps_the_remainder_of_a_split_node_as_sglang_does():
    # SGLang 0.5.23 stamps a node before splitting it where an access ends, so [3, 4] (not
    # accessed) counts as accessed by match [1, 2] and the older leaf [9] is the LRU victim.
    c = lru(5, "node")
    c.insert([1, 2, 3, 4])
    c.insert([9])
    c.match_prefix([1, 2])
    c.evict(1)
    assert c.peek_prefix([9]) == 0 and c.peek_prefix([1, 2, 3, 4]) == 4
    c.check_invariants()


def test_split_remainder_restamp_never_marks_for_rlt():
    c = make_cache(5, {"name": "rlt", "granularity": "node"}, 0)
    c.insert([1, 2, 3, 4])
    c.policy.reset_phase()
    c.match_prefix([1, 2])  # splits [1,2 | 3,4]: only the accessed half is marked
    assert c.policy.marked_count == 2
    c.check_invariants()


def test_token_granularity_stamps_accessed_tokens_only():
    c = lru(5, "token")
    c.insert([1, 2, 3, 4])
    c.insert([9])
    c.match_prefix([1, 2])
    c.evict(1)  # (1,2,3,4) was accessed before [9]: the paper's model evicts it first
    assert c.peek_prefix([1, 2, 3, 4]) == 3 and c.peek_prefix([9]) == 1


def test_evicted_node_handle_cannot_be_locked_and_evict_arg_checked():
    c = lru(10, "node")
    r = c.insert([1, 2])
    c.evict(2)
    with pytest.raises(ValueError, match="evicted node"):
        c.inc_lock_ref(r.last_node)
    with pytest.raises(ValueError):
        c.evict(1.5)
    assert c.evict(0) == 0 and c.evict(-3) == 0


def test_constructor_errors():
    with pytest.raises(ValueError, match=">= 0"):
        RadixCache(-1)
    with pytest.raises(ValueError, match="int"):
        RadixCache(3.0)
    with pytest.raises(ValueError, match="granularity"):
        RadixCache(10, LRUEviction(), "page")
    assert RadixCache(10, LRUEviction()).granularity == "node"
    pol = LRUEviction()
    RadixCache(10, pol)
    with pytest.raises(ValueError, match="already attached"):
        RadixCache(10, pol)


def test_process_path_rejects_too_long_path():
    c = lru(3)
    with pytest.raises(CapacityError, match="cannot fit"):
        c.process_path([1, 2, 3, 4])


# ---------------------------------------------------------------- factory and config files
def test_make_eviction_and_make_cache():
    assert isinstance(make_eviction({"name": "lru"}, 0), LRUEviction)
    assert isinstance(make_eviction({"_target_": "repro.kvcache.RLTEviction"}, np.random.default_rng(3)), RLTEviction)
    c = make_cache(64, {"name": "rlt", "granularity": "token"}, 1)
    assert c.granularity == "token" and c.capacity_tokens == 64
    assert not hasattr(c.policy, "granularity")  # stored once: the cache's
    assert make_cache(64, {"name": "lru"}, 0).granularity == "node"  # SGLang's default
    c = make_cache(64, {"_target_": "repro.kvcache.LRUEviction", "name": "lru", "granularity": "token"}, 0)
    assert isinstance(c.policy, LRUEviction) and c.granularity == "token"


@pytest.mark.parametrize(
    "cfg, msg",
    [
        ({"name": "fifo"}, "unknown eviction policy 'fifo'; choose one of lfu, lru, opt, rlt, rlt_shipped, slru"),
        ({"name": "opt"}, "future trace"),
        ({"name": "lru", "granularity": "page"}, "granularity"),
        ({"name": "lru", "granularity": "node"}, "granularity belongs to the cache"),
        ({"name": "lru", "capacity": 3}, "unknown eviction config keys"),
        ({}, "eviction needs a name"),
        ({"_target_": "repro.kvcache.RLTEviction", "name": "lru"}, "contradicts"),
        ({"_target_": "repro.kvcache.nothing_here.X"}, "cannot be imported"),
        ({"_target_": "repro.kvcache.RadixCache"}, "not an eviction policy class"),
        ({"_target_": "repro.kvcache.EvictionPolicy"}, "declares no `name` of its own"),
        ("lru", "mapping"),
    ],
)
def test_make_eviction_errors(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        make_eviction(cfg, 0)


def test_conf_eviction_files_build_node_granularity_policies():
    from omegaconf import OmegaConf

    for name in ("lru", "rlt"):
        path = ROOT / "conf" / "eviction" / f"{name}.yaml"
        raw = yaml.safe_load(path.read_text())
        cls = {"lru": LRUEviction, "rlt": RLTEviction}[name]
        assert raw == {"_target_": f"repro.kvcache.{cls.__name__}", "name": name, "granularity": "node"}
        cache = make_cache(128, OmegaConf.load(path), 0)  # a DictConfig is a Mapping
        assert cache.granularity == "node" and cache.policy.name == name


# ---------------------------------------------------------------- RLT specifics
def test_rlt_counters_and_phase_reset_on_full_marked_cache():
    c = make_cache(4, {"name": "rlt", "granularity": "token"}, 0)
    r = c.process_path([1, 2])
    c.dec_lock_ref(r.last_node)
    r = c.process_path([3, 4])
    c.dec_lock_ref(r.last_node)
    assert c.policy.marked_count == 4 and c.policy.resets == 0
    r = c.process_path([5])  # miss with the cache full and all marked: a new phase
    c.dec_lock_ref(r.last_node)
    s = c.stats()
    assert s["rlt_resets"] == 1 and s["rlt_phases"] == 2
    assert s["rlt_random_evicted_tokens"] == 1 and s["rlt_fallback_evicted_tokens"] == 0
    assert c.policy.marked_count == 1  # only the new token is marked
    c.check_invariants()


def test_rlt_bulk_evict_starts_a_new_phase_when_every_cached_token_is_marked():
    c = make_cache(6, {"name": "rlt", "granularity": "token"}, 0)
    c.insert([1, 2, 3])
    c.insert([4, 5])  # insert marks: 5 of 5 cached tokens marked
    pol = c.policy
    assert pol.marked_count == c.total_size() == 5 and pol.resets == 0
    # the caller needs room for new tokens: in the token-by-token model the cache would
    # be full of marked tokens at that miss, so a phase starts before the victim is drawn
    assert c.evict(1) == 1
    assert pol.resets == 1 and pol.random_evicted_tokens == 1 and pol.marked_count == 0
    c.check_invariants()


def test_rlt_fallback_used_when_unmarked_tokens_are_only_interior():
    c = make_cache(5, {"name": "rlt", "granularity": "token"}, 0)
    c.dec_lock_ref(c.process_path([1, 2, 3]).last_node)
    c.dec_lock_ref(c.process_path([1, 2, 4]).last_node)
    pol = c.policy
    # fake a new phase in which only the leaves (3) and (4) are marked: (1),(1,2) unmarked interior
    pol.reset_phase()
    for node in c.iter_nodes():
        if not node.children:
            pol.touch(node)
    assert pol.marked_count == 2 and not pol.unmarked
    c.evict(1)
    assert pol.fallback_evicted_tokens == 1 and pol.random_evicted_tokens == 0
    assert pol.marked_count == 1  # the evicted token took its mark with it
    assert c.peek_prefix([1, 2, 3]) == 2  # (1,2,3) was least recently used
    c.check_invariants()
