"""Config pieces that exist once: the paper's defaults and the six systems (conf/exp/shared/),
and the policy group as router x eviction (hydra_plugins/repro_policies) with derived names."""

from __future__ import annotations

import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from hydra_plugins.repro_policies import display_name, policies, register
from omegaconf import OmegaConf

from tests.harness.helpers import ROOT

CONF = ROOT / "conf"
EXPS = sorted(p.stem for p in (CONF / "exp").glob("*.yaml"))
SHARED_PAPER = yaml.safe_load((CONF / "exp" / "shared" / "paper.yaml").read_text())
# as written: `${protocol.systems.<option>}` each (issue 39), so no experiment spells the six out itself
SIX_RAW = yaml.safe_load((CONF / "exp" / "shared" / "six_systems.yaml").read_text())["policy"]
# as protocol=text resolves them: the paper's six options themselves
_TEXT_SYSTEMS = yaml.safe_load((CONF / "protocol" / "text.yaml").read_text())["protocol"]["systems"]
SIX = OmegaConf.to_container(OmegaConf.create({"protocol": {"systems": _TEXT_SYSTEMS}, "six": SIX_RAW}),
                             resolve=True)["six"]

# The names the figures and claims key on: must never move.
POLICY_NAMES = {
    "random_lru": "Random+LRU", "round_robin_lru": "RoundRobin+LRU",
    "cache_aware_lru": "CacheAware+LRU", "cache_aware_rlt": "CacheAware+RLT",
    "lbgr_lru": "LBGR+LRU", "lbgr_rlt": "LBGR+RLT",
    "power_of_two_lru": "PowerOfTwo+LRU", "power_of_two_rlt": "PowerOfTwo+RLT",
    "dynamo_lru": "Dynamo+LRU", "dynamo_rlt": "Dynamo+RLT",
    "llmd_lru": "llm-d+LRU", "llmd_rlt": "llm-d+RLT",
}


def _exp(name: str) -> dict:
    return yaml.safe_load((CONF / "exp" / f"{name}.yaml").read_text())


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("exp", EXPS)
def test_no_experiment_repeats_what_is_shared(exp):
    """An experiment with the paper's defaults pulls them in (first) and only states what differs;
    the six systems are spelt out nowhere but shared/six_systems."""
    cfg = _exp(exp)
    defaults = cfg.get("defaults", [])
    params = cfg.get("hydra", {}).get("sweeper", {}).get("params", {})
    assert params.get("policy") not in (SIX_RAW, SIX), "use shared/six_systems"
    if "shared/paper" in defaults:
        assert defaults[0] == "shared/paper" and "_self_" in defaults  # the experiment's own keys win
        shared = _flat({k: v for k, v in SHARED_PAPER.items()})
        own = _flat({k: v for k, v in cfg.items() if k in SHARED_PAPER})
        assert not {k for k in own if k in shared and own[k] == shared[k]}, "repeats conf/exp/shared/paper.yaml"
    if params.get("policy") == "???":
        assert defaults.index("shared/six_systems") > defaults.index("_self_")
    if "shared/six_systems" in defaults:
        assert params.get("policy") == "???"  # where policy sits in the sweep (the cells' order)


def test_paper_experiments_use_the_shared_pieces():
    users = {e for e in EXPS if "shared/paper" in _exp(e).get("defaults", [])}
    # their own trace / backend / a shrunk workload on real CPU servers
    assert users == set(EXPS) - {"mooncake_replay", "thm_competitive_ratio", "live_cpu_gsp", "live_cpu_artifact"}
    six = {e for e in EXPS if "shared/six_systems" in _exp(e).get("defaults", [])}
    assert len(six) == 14  # the 12 paper figures with the six systems + load_ladder + live_cpu_artifact


def test_six_systems_fill_the_sweep_in_place():
    """What the basic sweeper (-m, every launcher) and the in-process grid read: a plain string,
    in the position the experiment gives policy."""
    import repro.harness.schema  # noqa: F401

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["exp=fig2_main", "protocol=text"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)  # ${protocol.systems.X}
    assert list(params) == ["workload", "policy", "seed"] and params["policy"] == SIX
    assert cfg.workload.num_queries == 1024 and cfg.cluster.kv_cache_tokens == 32768  # gsp's limited budget


def test_policy_group_is_router_times_eviction():
    routers = sorted(p.stem for p in (CONF / "router").glob("*.yaml"))
    evictions = sorted(p.stem for p in (CONF / "eviction").glob("*.yaml"))
    assert set(policies()) == {f"{r}_{e}" for r in routers for e in evictions}
    got = {name: node["policy_name"] for name, node in policies().items()}
    assert {k: got[k] for k in POLICY_NAMES} == POLICY_NAMES


@pytest.mark.parametrize("policy", sorted(POLICY_NAMES))
def test_policy_option_composes_like_the_old_file(policy):
    """policy=X selects router and eviction and names the system; the display line never enters
    the config (nor the router's constructor)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"policy={policy}"], return_hydra_config=True)
    router, eviction = cfg.hydra.runtime.choices.router, cfg.hydra.runtime.choices.eviction
    assert f"{router}_{eviction}" == policy and cfg.hydra.runtime.choices.policy == policy
    assert cfg.policy_name == POLICY_NAMES[policy]
    yaml_keys = set(yaml.safe_load((CONF / "router" / f"{router}.yaml").read_text()))
    assert set(cfg.router) == yaml_keys and "display" not in cfg.router
    assert instantiate(cfg.router).name == router


def test_unknown_policy_is_hydras_own_error():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with pytest.raises(Exception, match="Could not find 'policy/nope'"):
            compose("config", overrides=["policy=nope"])


def test_display_name_rule(tmp_path):
    plain = tmp_path / "least_work_left.yaml"
    plain.write_text("# a router without a display line\n_target_: x\n")
    assert display_name(plain, "router") == "LeastWorkLeft"
    (tmp_path / "fifo.yaml").write_text("name: fifo\n")
    assert display_name(tmp_path / "fifo.yaml", "eviction") == "FIFO"
    named = tmp_path / "lbgr2.yaml"
    named.write_text("# @display LBGR-2\n# @package _group_\n_target_: x\n")
    assert display_name(named, "router") == "LBGR-2"
    late = tmp_path / "late.yaml"
    late.write_text("# text first\n# @display Late\n_target_: x\n")  # not a header line: the rule
    assert display_name(late, "router") == "Late"


def test_a_new_router_is_one_yaml_file(tmp_path):
    """Adding a router: its class (an existing one stands in) + conf/router/<name>.yaml; its
    policies, with their names, exist without any other edit."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf, ignore=shutil.ignore_patterns("local"))
    (conf / "router" / "toy_rand.yaml").write_text(
        "# @display Toy\n_target_: repro.routing.RandomRouter\nname: random\n")
    register(conf)
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose("config", overrides=["policy=toy_rand_rlt"])
        assert cfg.policy_name == "Toy+RLT" and cfg.eviction.name == "rlt"
        assert type(instantiate(cfg.router)).__name__ == "RandomRouter"
    finally:
        group = ConfigStore.instance().repo["policy"]
        for name in ("toy_rand_lru.yaml", "toy_rand_rlt.yaml"):
            group.pop(name, None)
        register()  # the real conf/ again (the same nodes)


def test_systems_resolver_adds_to_the_paper_six(tmp_path, monkeypatch, capsys):
    """Issue 32 point 3: `hydra.sweeper.params.policy=${systems:mine}` is the six plus mine, in the
    in-process grid (and the -m callback: both resolve the sweep params the same way)."""
    import repro.harness.schema  # noqa: F401  (registers the resolver, as repro.run does)
    from tests.harness.helpers import run_inprocess

    extra = "${systems:power_of_two_rlt,lbgr_lru}"  # lbgr_lru is one of the six: not twice
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["exp=fig2_main", "protocol=text", f"hydra.sweeper.params.policy={extra}"],
                      return_hydra_config=True)
    assert OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)["policy"] == SIX + ",power_of_two_rlt"
    code = run_inprocess(tmp_path, "+exp=fig2_main", "protocol=text", "workload=gsp", "seed=0",
                         f"hydra.sweeper.params.policy={extra}",
                         "--dry-run", monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    # a grid beyond the paper's: its own folder, named after the system it gained (issue 42)
    assert code == 0 and "fig2_main+power_of_two_rlt: 7 cell(s)" in out and "policy=power_of_two_rlt" in out, out
