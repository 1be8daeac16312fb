"""Every option of every config group in conf/ composes and builds (router instantiated, eviction
policy, cost model, KV capacity, workload, backend importable) — checked through the same deep
validation the harness runs before a sweep."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from repro.harness.compose import resolve
from repro.harness.validate import cell_errors
from tests.harness.helpers import ROOT

GROUPS = ("model", "hardware", "workload", "router", "eviction", "policy", "backend", "tracking")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((ROOT / "conf" / g).glob("*.yaml"))]
def compose_option(group: str, option: str) -> dict:
    import repro.harness.schema  # noqa: F401

    overrides = [f"{group}={option}"]
    if group == "router":  # a system is chosen as router x eviction (router= alone keeps LBGR+RLT's name)
        overrides = [f"policy={option}_rlt"]
    elif group == "eviction":
        overrides = [f"policy=lbgr_{option}"]
    if group == "model":
        overrides.append("hardware=h200")  # the paper's GPU for 70B and Mixtral (8B fits it too)
    if (group, option) == ("hardware", "cpu"):
        overrides.append("model=tiny_llama")  # a CPU server holds the tiny model, not 8B
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = resolve(compose("config", overrides=overrides))
    if "num_queries" in cfg.get("workload", {}):
        cfg["workload"]["num_queries"] = 16  # building, not running: keep it small
    return cfg


def test_the_harness_groups_exist():
    assert {o for g, o in OPTIONS if g == "backend"} == {"sim", "sglang", "theory"}
    assert {o for g, o in OPTIONS if g == "tracking"} == {"offline", "online", "disabled"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_group_option_builds(group, option):
    cfg = compose_option(group, option)
    if group == "tracking":
        assert cfg["tracking"]["mode"] == option
    if group == "backend":
        from repro.backends import get_backend

        get_backend(cfg["backend"]["name"])
        if option == "theory":
            cfg["theory"] = {"panel": "thm5", "x": 4, "policy": "rlt", "quick": True}
    assert cell_errors(cfg, deep=True) == []
