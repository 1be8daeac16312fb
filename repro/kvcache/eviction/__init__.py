"""Leaf-eviction policies for `RadixCache`, one module each, and their registry.

A policy is a subclass of `EvictionPolicy` (base.py) that declares its own `name` and
`backends`. The built-in ones live in this package, where `eviction_policies()` finds them by
scanning it (so `{name: lru}` alone is enough); any other module may hold one too and names it
by `_target_` (an out-of-tree package, docs/EXTENDING.md). A conf/eviction/<name>.yaml:

    _target_: repro.kvcache.eviction.<module>.<Class>   # the built-in ones: repro.kvcache.<Class>
    name: <name>
    granularity: node                                    # node | token (the cache's, see radix_cache)
    <parameter>: <value>                                 # any keyword of the class's __init__

`make_cache(capacity_tokens, cfg, seed)` builds a cache from such a mapping (`_target_` and
`name` must agree; either one alone is enough for a built-in policy; the other keys are the
constructor's parameters); `check_eviction_config(cfg, backend)` lists what is wrong with it,
for the validators that must say so before any work starts.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Mapping

from repro.kvcache.eviction.base import EVICTION_BACKENDS, EvictionPolicy
from repro.kvcache.eviction.hit_count import LFUEviction, SLRUEviction
from repro.kvcache.eviction.lru import LRUEviction
from repro.kvcache.eviction.opt import OPTEviction
from repro.kvcache.eviction.rlt import RLTEviction
from repro.kvcache.eviction.rlt_shipped import RLTShippedEviction
from repro.kvcache.radix_cache import GRANULARITIES, RadixCache

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "EVICTION_BACKENDS",
    "EvictionPolicy",
    "LFUEviction",
    "LRUEviction",
    "OPTEviction",
    "RLTEviction",
    "RLTShippedEviction",
    "SLRUEviction",
    "check_eviction_config",
    "constructor_params",
    "eviction_policies",
    "make_cache",
    "make_eviction",
]

_CONFIG_KEYS = ("_target_", "name", "granularity")
# Given by whoever builds the policy (`create`), never by its config.
_BUILDER_ARGS = ("self", "seed", "trace", "index")
# granularities a backend can run (default: all); SGLang's RadixCache evicts whole nodes
_BACKEND_GRANULARITIES = {"sglang": ("node",)}

_registry: dict[str, type[EvictionPolicy]] | None = None
# Out-of-tree policies this process has accepted by `_target_`, by name: an approximate tracker
# mirrors a worker's policy by name (WorkerView.eviction_policy; with the class's default parameters).
_named_by_target: dict[str, type[EvictionPolicy]] = {}


def _declaration_errors(obj: type) -> list[str]:
    """Why a class with its own `name` is not a usable policy (empty: it is)."""
    where = f"{obj.__module__}.{obj.__qualname__}"
    backends = obj.__dict__.get("backends")
    if not isinstance(backends, frozenset) or not backends or not backends <= set(EVICTION_BACKENDS):
        return [f"{where}: `backends` must be a non-empty frozenset of {EVICTION_BACKENDS}, got {backends!r}"]
    return []


def _discover() -> dict[str, type[EvictionPolicy]]:
    found: dict[str, type[EvictionPolicy]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if not (isinstance(obj, type) and issubclass(obj, EvictionPolicy) and obj.__module__ == module.__name__):
                continue
            name = obj.__dict__.get("name")
            if not name:
                continue  # a helper base class, not a policy
            where = f"{obj.__module__}.{obj.__qualname__}"
            if name in found:
                other = found[name]
                raise TypeError(
                    f"eviction policy name {name!r} is declared twice: {other.__module__}.{other.__qualname__} and {where}"
                )
            errs = _declaration_errors(obj)
            if errs:
                raise TypeError(errs[0])
            found[name] = obj
    return dict(sorted(found.items()))


def eviction_policies() -> dict[str, type[EvictionPolicy]]:
    """name -> policy class, for every policy declared in this package (sorted by name)."""
    global _registry
    if _registry is None:
        _registry = _discover()
    return dict(_registry)


def _resolve(cfg) -> tuple[type[EvictionPolicy] | None, list[str]]:
    """The policy class a config names, or None and why not."""
    registry = eviction_policies()
    choices = ", ".join(registry)
    name = cfg.get("name")
    target = cfg.get("_target_")
    cls = None
    if target is not None:
        obj = None
        if isinstance(target, str) and "." in target:
            module, _, attr = target.rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), attr, None)
            except (ImportError, ValueError) as e:  # ValueError: an empty module name (".X")
                return None, [f"eviction._target_={target!r} cannot be imported ({e})"]
        if not (isinstance(obj, type) and issubclass(obj, EvictionPolicy)):
            return None, [
                f"eviction._target_={target!r} is not an eviction policy class (e.g. repro.kvcache.LRUEviction)"
            ]
        own = obj.__dict__.get("name")
        if not own:
            return None, [
                f"eviction._target_={target!r} declares no `name` of its own: a helper class, not a policy "
                "(a policy class declares `name` and `backends`)"
            ]
        if own in registry and registry[own] is not obj:
            other = registry[own]
            return None, [
                f"eviction._target_={target!r} is named {own!r}, the name of the built-in "
                f"{other.__module__}.{other.__qualname__}: choose another name"
            ]
        why = _declaration_errors(obj)
        if why:
            return None, why
        if own not in registry and _named_by_target.setdefault(own, obj) is not obj:
            other = _named_by_target[own]
            return None, [
                f"eviction._target_={target!r} is named {own!r}, like {other.__module__}.{other.__qualname__}: "
                "two policies cannot share a name"
            ]
        cls = obj
        if name is not None and name != cls.name:
            return None, [f"eviction.name={name!r} contradicts eviction._target_={target!r} (policy {cls.name!r})"]
    elif name is None:
        return None, [f"eviction needs a name: one of {choices}"]
    else:
        cls = (registry.get(name) or _named_by_target.get(name)) if isinstance(name, str) else None
        if cls is None:
            return None, [f"unknown eviction policy {name!r}; choose one of {choices}"]
    return cls, []


def constructor_params(cls: type[EvictionPolicy]) -> dict[str, object]:
    """{parameter: default} a policy takes from its config: its __init__'s keywords, less what the
    builder gives (seed, trace); `inspect.Parameter.empty` for a required one."""
    import inspect

    out = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in _BUILDER_ARGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        out[p.name] = p.default
    return out


def policy_params(cfg: Mapping) -> dict:
    """The constructor parameters of an eviction config: every key but _target_, name, granularity."""
    return {k: v for k, v in cfg.items() if k not in _CONFIG_KEYS}


def check_eviction_config(cfg, backend: str | None = None) -> list[str]:
    """What is wrong with an eviction config (empty list: nothing), before any work starts.

    Checks the policy (`name` / `_target_`, agreeing; a name alone must be a built-in one),
    its parameters (the keys besides _target_, name and granularity: keywords of the class's
    __init__, required ones given), the granularity and, if `backend` is given (one of
    EVICTION_BACKENDS: "sim" also for the emulated SGLang workers, which run our RadixCache;
    "sglang" for the real SGLang servers), that the backend can run this policy at this
    granularity.
    """
    if not isinstance(cfg, Mapping):
        return [f"eviction config must be a mapping like {{name: lru, granularity: node}}, got {cfg!r}"]
    errs = []
    gran = cfg.get("granularity")
    if gran is not None and gran not in GRANULARITIES:
        errs.append(f"eviction.granularity must be one of {', '.join(GRANULARITIES)} (got {gran!r})")
    cls, why = _resolve(cfg)
    errs += why
    if cls is not None:
        import inspect

        accepted = constructor_params(cls)
        unknown = sorted(set(policy_params(cfg)) - set(accepted), key=str)
        if unknown:
            errs.append(
                f"unknown eviction config keys {unknown}; allowed: {list(_CONFIG_KEYS) + list(accepted)} "
                f"(besides _target_, name and granularity: the parameters of {cls.__name__}.__init__)"
            )
        missing = [k for k, d in accepted.items() if d is inspect.Parameter.empty and k not in cfg]
        if missing:
            errs.append(f"eviction policy {cls.name!r} needs the parameter(s) {missing} in its config")
    if backend is not None:
        if backend not in EVICTION_BACKENDS:
            errs.append(f"unknown backend {backend!r} for an eviction check; one of {', '.join(EVICTION_BACKENDS)}")
        elif cls is not None and backend not in cls.backends:
            runs_on = ", ".join(b for b in EVICTION_BACKENDS if b in cls.backends)
            errs.append(f"eviction policy {cls.name!r} does not run on backend {backend} (it runs on: {runs_on})")
        allowed = _BACKEND_GRANULARITIES.get(backend)
        if allowed is not None and (gran or "node") not in allowed:
            errs.append(
                f"eviction.granularity={gran!r}: backend {backend} runs granularity {' | '.join(allowed)} only "
                "(SGLang evicts whole radix-tree nodes)"
            )
    return errs


def _checked_class(cfg) -> type[EvictionPolicy]:
    errs = check_eviction_config(cfg)
    if errs:
        raise ValueError("; ".join(errs))
    return _resolve(cfg)[0]


def make_eviction(cfg: Mapping, seed: "int | np.random.Generator" = 0) -> EvictionPolicy:
    """The policy of an eviction config `{name: lru | rlt | ...}` (no granularity: that is the
    cache's; use make_cache for a whole conf/eviction/*.yaml)."""
    cls = _checked_class(cfg)
    if cfg.get("granularity") is not None:
        raise ValueError(
            "make_eviction builds the policy only and the granularity belongs to the cache: "
            "make_cache(capacity, cfg, seed) (or RadixCache(capacity, policy, granularity))"
        )
    return cls.create(seed, **policy_params(cfg))


def make_cache(capacity_tokens: int, eviction_cfg: Mapping, seed: "int | np.random.Generator" = 0) -> RadixCache:
    """A RadixCache with the policy and granularity of `eviction_cfg` (granularity default: node)."""
    cls = _checked_class(eviction_cfg)
    return RadixCache(
        capacity_tokens, cls.create(seed, **policy_params(eviction_cfg)), eviction_cfg.get("granularity") or "node"
    )
