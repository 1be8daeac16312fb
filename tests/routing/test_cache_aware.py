"""Decision tables for SGLang's cache-aware rule (sglang-router 0.3.2)."""

from __future__ import annotations

import numpy as np
import pytest

from repro.routing import CacheAwareRouter
from repro.routing.cache_aware import ids_key
from tests.routing.fakes import make_request, make_views

_ids = iter(range(10**6))


def req(text=None, tokens=None):
    if tokens is None:
        tokens = [ord(c) for c in text]
    return make_request(next(_ids), tokens, text=text)


def router(m=2, **kw):
    kw.setdefault("match_on", "text")
    kw.setdefault("worker_order", "index")
    r = CacheAwareRouter(**kw)
    views = make_views(m)
    r.reset(views, seed=0)
    return r, views


def route(r, views, text, now=0.0, **kw):
    return r.select_worker(req(text, **kw), views, now)


def test_defaults_are_sglang_router_032():
    r = CacheAwareRouter()
    assert (r.cache_threshold, r.balance_abs_threshold, r.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (r.eviction_interval_secs, r.max_tree_size) == (60.0, 2**26)
    assert (r.match_on, r.generation, r.worker_order) == ("auto", "v0_3_2", "seeded")


def test_cache_branch_goes_to_matched_worker():
    r, v = router()
    assert route(r, v, "hello world") == 0  # low match, loads tied: first in worker order
    assert r.last_branch == "low_match_tied"
    assert route(r, v, "goodbye") == 1  # low match: worker 1 is least loaded
    assert r.last_branch == "low_match_untied"
    assert route(r, v, "hello world, again") == 0  # 11/18 > 0.3
    assert r.last_branch == "hit"
    assert route(r, v, "goodbye and thanks") == 1


def test_low_match_least_loaded_vs_smallest_tree():
    # Worker 0 holds a long text and is idle again; worker 1 is busy with a short one.
    for rule, expected in (("v0_3_2", 0), ("le_0_2_3", 1)):
        r, v = router(generation=rule)
        a = req("x" * 50)
        assert r.select_worker(a, v, 0.0) == 0
        r.on_request_complete(a, 0, 1.0, 0.5, 0, 1.0)
        r.loads = [0, 1]
        r.tree.insert("qq", 1)
        assert route(r, v, "brand new") == expected, rule


def test_load_ties_follow_worker_order():
    r, v = router(m=4, worker_order=[2, 0, 3, 1])
    assert route(r, v, "aaaa") == 2  # all idle: first in the order
    assert route(r, v, "bbbb") == 0
    r.loads = [5, 5, 5, 5]
    assert route(r, v, "cccc") == 2
    r.loads = [100, 30, 100, 30]  # imbalanced: first minimum in the order is worker 3
    assert route(r, v, "dddd") == 3 and r.last_branch == "imbalanced"


def test_seeded_worker_order_is_a_fixed_permutation_of_the_seed():
    orders = set()
    for seed in range(12):
        r = CacheAwareRouter(match_on="text")
        r.reset(make_views(4), seed=seed)
        again = CacheAwareRouter(match_on="text")
        again.reset(make_views(4), seed=seed)
        assert r.order == again.order and sorted(r.order) == [0, 1, 2, 3]
        orders.add(tuple(r.order))
        assert r.select_worker(req("first"), make_views(4), 0.0) == r.order[0]
    assert len(orders) > 3


@pytest.mark.parametrize("bad", [[0, 0, 1], [0, 1], [0, 1, 5], "hash", [-1, 0]])
def test_bad_worker_order(bad):
    with pytest.raises(ValueError, match="worker_order"):
        r = CacheAwareRouter(worker_order=bad)
        r.reset(make_views(3), seed=0)


def test_tie_break_is_rejected_with_a_pointer_to_worker_order():
    with pytest.raises(ValueError, match="worker_order"):
        CacheAwareRouter(tie_break="index")


@pytest.mark.parametrize(
    "query, expected, why",
    [
        ("abcdefghij", 0, "7/10 = 0.7 > 0.3: matched worker"),
        ("abcdXXXXXX", 0, "4/10 = 0.4 > 0.3: matched worker"),
        ("abcXXXXXXX", 1, "3/10 = 0.3 is not > 0.3: least loaded"),
        ("abXXXXXXXX", 1, "2/10 < 0.3: least loaded"),
    ],
)
def test_threshold_edges(query, expected, why):
    r, v = router()
    assert route(r, v, "abcdefg") == 0
    assert route(r, v, query) == expected, why


def test_threshold_zero_and_one():
    r, v = router(cache_threshold=0.0)
    route(r, v, "abcdefg")
    assert route(r, v, "aZZZZZZZZZ") == 0  # 0.1 > 0
    r, v = router(cache_threshold=1.0)
    route(r, v, "abcdefg")
    assert route(r, v, "abcdefg") == 1  # rate 1.0 is never > 1.0


@pytest.mark.parametrize(
    "loads, imbalanced",
    [
        ([65, 0], True),  # 65 > 64 and 65 > 0
        ([64, 0], False),  # difference 64 is not > 64
        ([200, 130], True),  # 70 > 64 and 200 > 195
        ([190, 130], False),  # 60 <= 64
        ([300, 200], False),  # 300 is not > 1.5 * 200
        ([301, 200], True),
    ],
)
def test_imbalance_rule(loads, imbalanced):
    r, v = router()
    route(r, v, "shared prefix text")  # worker 0 owns it
    r.loads = list(loads[::-1]) if loads[0] < loads[1] else list(loads)  # worker 0 is the loaded one
    w = route(r, v, "shared prefix text, more")
    assert w == (1 if imbalanced else 0)


def test_imbalanced_goes_to_first_minimum_and_still_inserts():
    r, v = router(m=3)
    r.loads = [100, 10, 10]
    assert route(r, v, "zzzzzzzzzz") == 1  # first minimum
    assert r.loads == [100, 11, 10]
    r.loads = [10, 11, 10]  # balanced again: the tree knows worker 1 got the text
    assert route(r, v, "zzzzzzzzzz!") == 1


def test_shared_node_tenant_is_its_creator():
    r, v = router(m=3)
    r.tree.insert("abcdef", 2)  # worker 2 created the node
    r.tree.insert("abcdef", 1)
    assert route(r, v, "abcdefgh") == 2


def test_load_counter_follows_dispatch_and_completion():
    r, v = router()
    a = req("first")
    w = r.select_worker(a, v, 0.0)
    assert r.loads[w] == 1
    r.on_request_complete(a, w, 1.0, 0.5, 0, 1.0)
    r.on_request_complete(a, w, 1.0, 0.5, 0, 1.0)  # a duplicate never drives it negative
    assert r.loads == [0, 0]


def test_tree_trimming_every_interval_of_now():
    r, v = router(max_tree_size=5, eviction_interval_secs=10.0)
    route(r, v, "aaaaaaaa", now=0.0)  # first call anchors the schedule: next trim at t=10
    route(r, v, "bbbbbbbb", now=1.0)
    route(r, v, "aaaaaaaaX", now=9.99)
    assert r.evictions_run == 0 and r.tree.tenant_size[0] == 9
    route(r, v, "cccccc", now=10.0)  # trims first (both workers over 5), then routes
    assert r.evictions_run == 1
    # Worker 0 held "aaaaaaaa"+"X" (9), worker 1 "bbbbbbbb" (8): both trimmed leaf by leaf to 0,
    # then "cccccc" (no match) goes to the least loaded worker (loads 2, 1): worker 1.
    assert r.tree.tenant_size == {0: 0, 1: 6}
    route(r, v, "dd", now=35.0)  # t=20 and t=30 were missed: one trim, next deadline t=40
    assert r.evictions_run == 2 and r._next_eviction_s == 40.0
    assert r.tree.tenant_size == {0: 2, 1: 0}  # "cccccc" trimmed; "dd" to worker 0 (loads 2, 2: first)


def test_trimming_disabled_and_lru_choice():
    r, v = router(max_tree_size=0, eviction_interval_secs=0)
    route(r, v, "aaaa", now=0.0)
    route(r, v, "bbbb", now=1e9)
    assert r.evictions_run == 0 and sum(r.tree.tenant_size.values()) == 8


def test_character_level_counts_characters_not_bytes():
    r, v = router()
    assert route(r, v, "ééé") == 0
    # "éé" + 8 more: 2 of 10 characters match (in UTF-8 bytes it would be 4 of 12 = 0.33)
    assert route(r, v, "ééxxxxxxxx") == 1


def test_token_mode_matches_ids_joined_by_spaces_in_characters():
    r, v = router(match_on="tokens")
    base = [1000 + i for i in range(100)]  # 4 digits + a space: 5 characters per token
    assert r.select_worker(make_request(1, base), v, 0.0) == 0
    assert r.select_worker(make_request(2, base[:50] + [9999] * 50), v, 0.0) == 0  # ~0.5
    assert r.select_worker(make_request(3, base[:30] + [7777] * 70), v, 0.0) == 0  # 150/499 > 0.3
    assert r.last_branch == "hit"
    assert r.select_worker(make_request(4, base[:29] + [7777] * 71), v, 0.0) == 1  # 145/499 <= 0.3
    assert r.last_branch == "low_match_untied"
    assert r.tree.tenant_size[1] == len(ids_key(base[:29] + [7777] * 71)) == 499
    # The key is text: token 82 and token 823 share the characters "82".
    assert r.tree.prefix_match(ids_key([823]))[0] == 0
    r.tree.insert(ids_key([82]), 1)
    assert r.tree.prefix_match(ids_key([823]))[0] == 2


def test_auto_mode_and_missing_text():
    r = CacheAwareRouter()  # auto
    v = make_views(2)
    r.reset(v, 0)
    r.select_worker(req("some text"), v, 0.0)
    assert r.mode == "text"
    with pytest.raises(ValueError, match="no text"):
        r.select_worker(make_request(99, [1, 2, 3]), v, 0.0)
    r.reset(v, 0)
    r.select_worker(make_request(100, [1, 2, 3]), v, 0.0)
    assert r.mode == "tokens"


@pytest.mark.parametrize(
    "kw",
    [
        {"cache_threshold": 1.5},
        {"balance_abs_threshold": -1},
        {"match_on": "bytes"},
        {"low_match": "smallest_tree"},  # replaced by generation: le_0_2_3
        {"max_tree_size": -5},
        {"generation": "smg_1_10"},
        {"generation": "smg_1_13", "balance_rel_threshold": 0.5},
    ],
)
def test_bad_config_fails_at_construction(kw):
    with pytest.raises(ValueError):
        CacheAwareRouter(**kw)


def test_unknown_generation_names_the_choices():
    with pytest.raises(ValueError, match="le_0_2_3.*v0_3_2.*smg_1_13"):
        CacheAwareRouter(generation="0.4")


def test_yaml_default_generation_is_the_papers():
    from omegaconf import OmegaConf

    from repro.confutil import PROJECT_ROOT

    cfg = OmegaConf.load(PROJECT_ROOT / "conf" / "router" / "cache_aware.yaml")
    assert cfg.generation == CacheAwareRouter().generation == "v0_3_2"


# --- generation smg_1_13 (smg 1.13.0), hand-made cases; tests/routing/test_cache_aware_reference.py
# checks it against a reference on random traffic, tests/router_binary against the binary
def smg(m=3, **kw):
    return router(m, generation="smg_1_13", **kw)


def test_smg_hit_goes_to_the_least_loaded_holder():
    r, v = smg(m=3)
    r.pick_tie = min
    r.route_key("shared prefix one", 0.0)  # low match, all idle: tie -> 0
    assert r.last_branch == "low_match_tied" and r.last_ties == (0, 1, 2)
    r.commit("shared prefix two", 2)  # worker 2 now holds the prefix as well
    r.loads = [5, 0, 1]
    assert r.route_key("shared prefix three", 0.0) == 2  # holders 0 and 2: 2 is less loaded
    assert r.last_branch == "hit"  # 0.3.2 would send it to the creator, worker 0


def test_smg_spill_gate_margin_is_two_sigma_rounded_up():
    r, v = smg(m=3, balance_abs_threshold=64)
    w = r.route_key("abcdefgh", 0.0)  # low match, a tie: a worker w of the seeded draw
    others = [t for t in range(3) if t != w]
    # mean 20/3: margin min(64, max(4, ceil(2 * 2.58))) = 6; w spills once its load > 6.67 + 6
    for load, spills in ((12, False), (13, True)):
        r.loads = [0] * 3
        r.loads[w], r.loads[others[0]] = load, 20 - load
        assert r.decide("abcdefgh!", 0.0) in ((others[1],) if spills else (w,))
        assert r.last_branch == ("spill" if spills else "hit")
    r.loads = [0, 0, 0]
    r.loads[w] = 3  # mean 1: 3 > 1.5 and > 1 + 2, but the margin is never under 4
    assert r.decide("abcdefgh!", 0.0) == w and r.last_branch == "hit"


def test_smg_random_ties_follow_the_seed():
    picks = []
    for _ in range(2):
        r, v = smg(m=4)
        picks.append([])
        for i in range(40):
            w = r.route_key(f"{i} brand new", 0.0)  # all idle: a four-way tie
            assert r.last_branch == "low_match_tied" and r.last_ties == (0, 1, 2, 3)
            r.release(w)
            picks[-1].append(w)
    assert picks[0] == picks[1]
    assert len(set(picks[0])) == 4  # ties spread over all workers (40 draws: all four with near certainty)


def test_smg_trim_is_one_budget_for_the_tree():
    r, v = smg(m=2, eviction_interval_secs=1, max_tree_size=10)
    r.route_key("aaaaaaaa", 0.0)  # worker of the tie, 8 units
    r.commit("bbbbbbbb", 1 - r.loads.index(1))  # the other worker, 8 units: total 16 > 10, each <= 10
    r.route_key("zz", 1.5)  # due: trims the oldest leaf (the first key), whoever holds it
    sizes = r.tree.used_size_per_tenant()
    assert sum(sizes.values()) <= 10 and sorted(sizes.values()) in ([0, 8], [2, 8])


# --- the match-rate test without numpy scalars (CacheAwareRouter._rate_above) vs float32 arithmetic
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _rate_above_f32(matched: int, total: int, threshold: float) -> bool:
    t32 = np.float32(threshold)
    rate = np.float32(matched) / np.float32(total) if total else np.float32(0.0)
    return bool(rate > t32)


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 2**25), st.integers(0, 2**25), st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.3, 0.5, 1.0])))
def test_rate_above_equals_float32_division(a, b, threshold):
    matched, total = min(a, b), max(a, b)
    router = CacheAwareRouter(cache_threshold=threshold)
    assert router._rate_above(matched, total) == _rate_above_f32(matched, total, threshold)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.1, 1 / 3])
def test_rate_above_at_the_float32_boundary(threshold):
    # quotients next to the float32 threshold, where rounding decides
    router = CacheAwareRouter(cache_threshold=threshold)
    for total in (3, 10, 1000, 99991, 2**24 - 1, 2**24 + 3):
        base = int(threshold * total)
        for matched in range(max(0, base - 2), min(total, base + 3) + 1):
            assert router._rate_above(matched, total) == _rate_above_f32(matched, total, threshold)
