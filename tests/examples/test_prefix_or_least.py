"""The worked example (examples/prefix_or_least/, docs/EXTENDING.md) against simple references on
random inputs, and its configs through the harness's own checks (issue 32)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "prefix_or_least"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from prefix_or_least.eviction import OldestOrRandomEviction  # noqa: E402
from prefix_or_least.router import PrefixOrLeastLoadedRouter  # noqa: E402

from repro.kvcache import check_eviction_config, make_cache  # noqa: E402
from tests.routing.fakes import make_request  # noqa: E402

CONF = EXAMPLE / "prefix_or_least" / "conf"


# -- the router ---------------------------------------------------------------------------------
class ListView:
    """A worker holding whole prompts (lists); peek_prefix by brute force."""

    def __init__(self, worker_id: int, cached: list[list[int]], in_flight: int):
        self.worker_id, self.cached, self.in_flight = worker_id, cached, in_flight

    def peek_prefix(self, key) -> int:
        tokens = np.frombuffer(key, dtype=np.int32).tolist()
        best = 0
        for c in self.cached:
            n = 0
            while n < min(len(c), len(tokens)) and c[n] == tokens[n]:
                n += 1
            best = max(best, n)
        return best


def reference_choice(prompt, views, min_match) -> int:
    matches = [v.peek_prefix(np.asarray(prompt, dtype=np.int32).tobytes()) for v in views]
    if prompt and max(matches) > min_match * len(prompt):
        return matches.index(max(matches))
    loads = [v.in_flight for v in views]
    return loads.index(min(loads))


tokens = st.lists(st.integers(0, 3), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(prompt=tokens, workers=st.lists(st.tuples(st.lists(tokens, max_size=3), st.integers(0, 3)), min_size=1, max_size=4),
       min_match=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_router_matches_its_reference(prompt, workers, min_match):
    views = [ListView(i, cached, load) for i, (cached, load) in enumerate(workers)]
    router = PrefixOrLeastLoadedRouter(min_match=min_match)
    router.reset(views, seed=0)
    got = router.select_worker(make_request(0, prompt), views, 0.0)
    assert got == reference_choice(prompt, views, min_match)


# -- the eviction policy -------------------------------------------------------------------------
class ReferenceOldestOrRandom:
    """Disjoint prompts are whole leaves: a list in arrival order is the whole cache."""

    def __init__(self, capacity: int, p_random: float, seed: int):
        self.capacity, self.p, self.rng, self.cached = capacity, p_random, np.random.default_rng(seed), []

    def admit(self, prompt: list[int]) -> None:
        need = len(prompt) - (self.capacity - sum(map(len, self.cached)))
        evicted = 0
        while evicted < need and self.cached:
            i = int(self.rng.integers(len(self.cached))) if self.p and self.rng.random() < self.p else 0
            evicted += len(self.cached.pop(i))
        self.cached.append(prompt)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40), p_random=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 2**16))
def test_eviction_matches_its_reference(sizes, p_random, seed):
    cfg = {"_target_": "prefix_or_least.eviction.OldestOrRandomEviction", "name": "oldest_or_random",
           "granularity": "node", "p_random": p_random}
    cache = make_cache(12, cfg, seed)
    assert type(cache.policy) is OldestOrRandomEviction and cache.policy.p_random == p_random
    ref = ReferenceOldestOrRandom(12, p_random, seed)
    for i, n in enumerate(sizes):
        prompt = [1000 * i + j for j in range(n)]
        need = len(prompt) - cache.free_tokens()
        if need > 0:
            assert cache.evict(need) >= need
        cache.insert(prompt)
        ref.admit(prompt)
        cache.check_invariants()
        assert cache.cached_keys() == {np.asarray(p[:k], dtype=np.int32).tobytes()
                                       for p in ref.cached for k in range(1, len(p) + 1)}


def test_the_policy_keeps_its_state_in_the_node_slot_across_splits():
    cache = make_cache(100, {"_target_": "prefix_or_least.eviction.OldestOrRandomEviction", "p_random": 0.0}, 0)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 9])  # splits [1,2,3,4] into [1,2] + [3,4]
    leaves = sorted(cache.iter_evictable_leaves(), key=lambda n: n.state)
    assert [n.n for n in leaves] == [2, 1] and all(n.state is not None for n in cache.iter_nodes() if n.parent)
    cache.evict(1)  # the oldest leaf goes first: [3, 4]
    assert cache.peek_prefix(np.asarray([1, 2, 3, 4], dtype=np.int32)) == 2


# -- the configs ---------------------------------------------------------------------------------
def test_the_example_configs_are_valid_and_their_keys_are_the_constructors():
    import inspect

    from hydra.utils import instantiate

    router_yaml = yaml.safe_load((CONF / "router" / "prefix_or_least.yaml").read_text())
    router = instantiate(router_yaml)
    params = set(inspect.signature(PrefixOrLeastLoadedRouter.__init__).parameters) - {"self"}
    assert type(router) is PrefixOrLeastLoadedRouter and set(router_yaml) - {"_target_"} == params
    eviction_yaml = yaml.safe_load((CONF / "eviction" / "oldest_or_random.yaml").read_text())
    assert check_eviction_config(eviction_yaml, "sim") == []
    assert "does not run on backend sglang" in " ".join(check_eviction_config(eviction_yaml, "sglang"))
    with pytest.raises(ValueError, match="p_random"):
        make_cache(10, {**eviction_yaml, "p_random": 2.0}, 0)
