"""conf/router/*.yaml build their class with its documented defaults; policy=<router>_<eviction> composes
the right router x eviction pair through Hydra's compose API."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from hydra_plugins.repro_policies import policies as policy_options

import repro.routing as routing

CONF = Path(__file__).resolve().parents[2] / "conf"


def _router_class(path: Path) -> type:
    """The class a conf/router/*.yaml names by `_target_` (imported, not built)."""
    from hydra.utils import get_object

    return get_object(yaml.safe_load(path.read_text())["_target_"])


# Derived from conf/ (issue 32 point 2): a new router is its class plus its YAML, no list to edit.
ROUTERS = {p.stem: _router_class(p) for p in sorted((CONF / "router").glob("*.yaml"))}
# {policy option: (router option, eviction option, system name)}, from the policy group itself.
POLICIES = {
    name: (node["defaults"][0]["/router"], node["defaults"][1]["/eviction"], node["policy_name"])
    for name, node in policy_options(CONF).items()
}

# a second yaml of one class: the keys it sets otherwise than the class defaults (all else: the defaults)
PRESETS = {
    "cache_aware_smg": {"name": "cache_aware_smg", "generation": "smg_1_13"},
    "cache_aware_014": {"name": "cache_aware_014", "generation": "le_0_1_4", "cache_threshold": 0.5,
                        "balance_abs_threshold": 32, "balance_rel_threshold": 1.0001, "max_tree_size": 2**24},
}


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_router_yaml_builds_its_class_with_the_documented_defaults(name):
    cfg = yaml.safe_load((CONF / "router" / f"{name}.yaml").read_text())
    router = instantiate(cfg)
    cls = ROUTERS[name]
    assert type(router) is cls and router.name == name == cfg["name"]
    params = {
        p.name: p.default
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name not in ("self", "cache_factory") and p.name not in getattr(cls, "removed_options", ())
    }
    keys = {k for k in cfg if k != "_target_"}
    assert keys == set(params), "every constructor option is a documented key, and nothing else"
    preset = PRESETS.get(name, {})
    for key in keys:
        want = preset.get(key, params[key])
        assert cfg[key] == want, f"{name}.{key}: yaml {cfg[key]!r} != class default {want!r}"


def test_every_router_yaml_names_a_router_of_the_package():
    """In-tree routers are exported by repro.routing (the registry the other packages reach them by)."""
    assert ROUTERS
    for name, cls in ROUTERS.items():
        assert issubclass(cls, routing.Router) and getattr(routing, cls.__name__) is cls, name
    assert {r for r, _, _ in POLICIES.values()} == set(ROUTERS)  # the policy group: every router x every eviction


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_composes_router_and_eviction(conf_dir, policy):
    router_name, eviction, display = POLICIES[policy]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"policy={policy}"])
    assert cfg.policy_name == display
    assert cfg.router.name == router_name
    assert cfg.router._target_ == yaml.safe_load((CONF / "router" / f"{router_name}.yaml").read_text())["_target_"]
    assert cfg.eviction.name == eviction
    assert type(instantiate(cfg.router)) is ROUTERS[router_name]


def test_default_policy_is_lbgr_rlt_and_router_keys_override(conf_dir):
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name="config")
        assert (cfg.policy_name, cfg.router.name, cfg.eviction.name) == ("LBGR+RLT", "lbgr", "rlt")
        assert cfg.router.tracker == "approximate" and cfg.router.oracle_output_len is False
        cfg = compose(config_name="config", overrides=["policy=lbgr_lru", "router.decay_interval_s=0.5"])
    assert cfg.router.decay_interval_s == 0.5 and cfg.eviction.name == "lru"
    assert instantiate(cfg.router).decay_interval_s == 0.5
