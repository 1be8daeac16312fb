"""The eviction-policy registry: a new policy is one module in repro/kvcache/eviction/ + one config file.

`test_a_new_policy_is_one_module_and_one_config_file` shows it end to end with a toy policy
(FIFO on leaves, written by the test into a folder the package searches), built from a YAML
config file through make_cache, checked by check_eviction_config, replayed by name, and
driven through the simulator's verbs against a brute-force reference.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

import repro.kvcache.eviction as evpkg
from repro.kvcache import (
    EVICTION_BACKENDS,
    EvictionPolicy,
    LRUEviction,
    OPTEviction,
    RLTEviction,
    check_eviction_config,
    eviction_policies,
    make_cache,
)
from repro.kvcache.eviction.rlt_shipped import RLTShippedEviction
from repro.kvcache.replay import replay, replay_policy_names

ROOT = Path(__file__).resolve().parents[2]

TOY = '''
"""FIFO on leaves (a toy): evict the evictable leaf created first."""

from repro.kvcache.eviction.base import EvictionPolicy


class FIFOEviction(EvictionPolicy):
    name = "toy_fifo"
    backends = frozenset({"sim", "theory"})

    def evict(self, need):
        cache = self.cache
        evicted = 0
        while evicted < need:
            leaves = list(cache.iter_evictable_leaves())
            if not leaves:
                break
            node = min(leaves, key=lambda n: n.seq)
            r = min(node.n, need - evicted) if cache.granularity == "token" else node.n
            if r < node.n:
                cache.truncate_leaf(node, r)
            else:
                cache.evict_leaf(node)
            evicted += r
        return evicted, None
'''


@pytest.fixture
def toy_policy(tmp_path, monkeypatch):
    """A folder with the toy module, searched by the eviction package (as if the file were in it)."""
    (tmp_path / "toy_fifo.py").write_text(TOY)
    monkeypatch.setattr(evpkg, "__path__", [*evpkg.__path__, str(tmp_path)])
    monkeypatch.setattr(evpkg, "_registry", None)  # rescan; the old registry comes back afterwards
    yield f"{evpkg.__name__}.toy_fifo"
    sys.modules.pop(f"{evpkg.__name__}.toy_fifo", None)


def test_builtin_registry_and_backends():
    reg = eviction_policies()
    from repro.kvcache.eviction.hit_count import LFUEviction, SLRUEviction

    assert reg == {"lru": LRUEviction, "opt": OPTEviction, "rlt": RLTEviction, "lfu": LFUEviction, "slru": SLRUEviction, "rlt_shipped": RLTShippedEviction}
    assert LFUEviction.backends == SLRUEviction.backends == {"sim", "sglang"}
    for name, cls in reg.items():
        assert cls.name == name and cls.backends <= set(EVICTION_BACKENDS)
    assert LRUEviction.backends == RLTEviction.backends == {"sim", "sglang", "theory"}
    assert OPTEviction.backends == {"theory"}
    assert RLTEviction.randomized and not LRUEviction.randomized and not OPTEviction.randomized
    assert replay_policy_names() == ("lru", "opt", "rlt")
    eviction_policies().clear()  # a copy: the registry itself is untouched
    assert "lru" in eviction_policies()


class SpyLRU(LRUEviction):  # inherits `name` but declares none, outside the package: not a policy
    pass


class NamedLikeLRU(LRUEviction):  # outside the package, a built-in's name: refused
    name = "lru"
    backends = frozenset({"sim"})


class NoBackends(LRUEviction):
    name = "no_backends"


class NeedsWidth(LRUEviction):  # a required constructor parameter
    name = "needs_width"
    backends = frozenset({"sim"})

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width


def test_a_policy_outside_the_package_with_a_parameter():
    """Issue 32 point 7: `_target_` anywhere, parameters from the config, checked before building."""
    cfg = {"_target_": f"{__name__}.NeedsWidth", "name": "needs_width", "width": 3}
    assert check_eviction_config(cfg, "sim") == []
    assert make_cache(10, cfg, 0).policy.width == 3
    assert "needs_width" not in eviction_policies()  # named by _target_ only, never scanned for
    with pytest.raises(ValueError, match="unknown eviction config keys"):
        make_cache(10, {**cfg, "depth": 1}, 0)


def test_helper_subclasses_are_not_registered():
    assert eviction_policies()["lru"] is LRUEviction
    errs = check_eviction_config({"_target_": f"{__name__}.SpyLRU"})
    assert len(errs) == 1 and "declares no `name` of its own" in errs[0], errs


def test_every_conf_eviction_file_is_valid_for_the_backends_its_policy_declares():
    for path in sorted((ROOT / "conf" / "eviction").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        cls = eviction_policies()[cfg.name]
        assert cfg._target_ == f"repro.kvcache.{cls.__name__}", path
        for backend in EVICTION_BACKENDS:
            errs = check_eviction_config(cfg, backend)
            assert (errs == []) == (backend in cls.backends), (path, backend, errs)


@pytest.mark.parametrize(
    "cfg, backend, msg",
    [
        ({"name": "opt", "granularity": "token"}, "sim", "'opt' does not run on backend sim (it runs on: theory)"),
        ({"name": "opt"}, "sglang", "does not run on backend sglang"),
        ({"name": "rlt", "granularity": "token"}, "sglang", "granularity node only"),
        ({"name": "lru"}, "vidur", "unknown backend 'vidur'"),
        ({"name": "arc"}, "sim", "unknown eviction policy 'arc'; choose one of lfu, lru, opt, rlt, rlt_shipped, slru"),
        ({"name": "lru", "granularity": "page"}, None, "eviction.granularity must be one of token, node"),
        ({"name": "lru", "seed": 1}, None, "unknown eviction config keys ['seed']"),
        ({"name": "rlt", "p": 0.5}, None, "unknown eviction config keys ['p']"),
        ({"_target_": f"{__name__}.NamedLikeLRU"}, None, "the name of the built-in"),
        ({"_target_": f"{__name__}.NoBackends"}, None, "`backends` must be a non-empty frozenset"),
        ({"_target_": f"{__name__}.NeedsWidth"}, "sim", "needs the parameter(s) ['width']"),
        ({"_target_": "repro.kvcache.LRUEviction", "name": "rlt"}, None, "contradicts"),
        ({"_target_": ".LRUEviction"}, None, "cannot be imported"),
        ({"_target_": "LRUEviction"}, None, "not an eviction policy class"),
        ([1], None, "must be a mapping"),
    ],
)
def test_check_eviction_config_messages(cfg, backend, msg):
    errs = check_eviction_config(cfg, backend)
    assert any(msg in e for e in errs), errs


def test_check_eviction_config_accepts_what_the_backends_run():
    assert check_eviction_config({"name": "rlt", "granularity": "node"}, "sglang") == []
    assert check_eviction_config({"name": "rlt"}, "sglang") == []  # node is the default
    assert check_eviction_config({"name": "lru", "granularity": "token"}, "sim") == []
    assert check_eviction_config({"name": "opt", "granularity": "token"}, "theory") == []
    assert check_eviction_config({"_target_": "repro.kvcache.RLTEviction"}) == []


def test_a_duplicate_or_undeclared_policy_is_an_error_at_discovery(tmp_path, monkeypatch):
    (tmp_path / "dup_lru.py").write_text(
        "from repro.kvcache.eviction.base import EvictionPolicy\n"
        "class Again(EvictionPolicy):\n    name = 'lru'\n    backends = frozenset({'sim'})\n"
    )
    monkeypatch.setattr(evpkg, "__path__", [*evpkg.__path__, str(tmp_path)])
    monkeypatch.setattr(evpkg, "_registry", None)
    try:
        with pytest.raises(TypeError, match="'lru' is declared twice"):
            eviction_policies()
        (tmp_path / "dup_lru.py").write_text(
            "from repro.kvcache.eviction.base import EvictionPolicy\n"
            "class NoBackends(EvictionPolicy):\n    name = 'nb'\n"
        )
        sys.modules.pop(f"{evpkg.__name__}.dup_lru", None)
        with pytest.raises(TypeError, match="`backends` must be a non-empty frozenset"):
            eviction_policies()
    finally:
        sys.modules.pop(f"{evpkg.__name__}.dup_lru", None)


class _BruteFIFO:
    """Reference: cached prefixes with their creation order; FIFO among evictable leaf tokens' nodes.

    Node granularity only, on prompts that share no prefix (each prompt is one node, so the
    leaf created first is simply the oldest prompt still cached)."""

    def __init__(self, capacity):
        self.capacity, self.cached = capacity, []

    def admit(self, prompt):
        while sum(map(len, self.cached)) + len(prompt) > self.capacity:
            self.cached.pop(0)
        self.cached.append(prompt)


def test_a_new_policy_is_one_module_and_one_config_file(toy_policy, tmp_path):
    module = toy_policy
    # the config file: conf/eviction/toy_fifo.yaml would hold exactly this
    conf = tmp_path / "toy_fifo.yaml"
    conf.write_text(f"_target_: {module}.FIFOEviction\nname: toy_fifo\ngranularity: node\n")
    cfg = OmegaConf.load(conf)

    reg = eviction_policies()
    assert set(reg) == {"lfu", "lru", "opt", "rlt", "rlt_shipped", "slru", "toy_fifo"}
    toy = reg["toy_fifo"]
    assert issubclass(toy, EvictionPolicy) and toy.__module__ == module
    assert check_eviction_config(cfg, "sim") == []
    assert any("does not run on backend sglang" in e for e in check_eviction_config(cfg, "sglang"))
    assert replay_policy_names() == ("lru", "opt", "rlt", "toy_fifo")

    # built through the config path (by _target_ and by name alone, as LBGR's trackers do)
    cache = make_cache(12, cfg, 0)
    assert type(cache.policy) is toy and cache.granularity == "node"
    assert type(make_cache(12, {"name": "toy_fifo"}, 0).policy) is toy

    # the simulator's sequence of verbs, against the brute-force FIFO
    ref = _BruteFIFO(12)
    rng = np.random.default_rng(0)
    for i in range(40):
        prompt = [1000 * i + j for j in range(int(rng.integers(1, 6)))]
        need = len(prompt) - cache.free_tokens()
        if need > 0:
            assert cache.evict(need) >= need
        cache.insert(prompt)
        ref.admit(prompt)
        cache.check_invariants()
        assert cache.cached_keys() == {
            np.asarray(p[:k], dtype=np.int32).tobytes() for p in ref.cached for k in range(1, len(p) + 1)
        }

    # and the replayer runs it by name (token granularity, the paper's path model)
    res = replay([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3]], 4, "toy_fifo", "token")
    assert res.misses + res.hits == res.num_tokens and res.evicted_tokens > 0
    res.cache.check_invariants()


def test_the_toy_is_gone_after_its_test():
    assert "toy_fifo" not in eviction_policies()
