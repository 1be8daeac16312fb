"""Each policy runs a small simulated experiment end to end (Hydra config -> repro.backends.sim)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from repro.backends.sim import run_cell
from tests.routing.test_configs import POLICIES

NUM_QUERIES = 48
SMALL_CELL = [
    f"workload.num_queries={NUM_QUERIES}",
    "workload.num_groups=4",
    "workload.prompts_per_group=null",
    "workload.system_prompt_len_range=[200,400]",
    "workload.question_len=32",
    "workload.output_len=4",
    "workload.request_rate=12.0",
    "cluster.kv_cache_tokens=1500",  # small enough that eviction happens
]


def _cell(conf_dir, policy, extra=()):
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"policy={policy}", *SMALL_CELL, *extra])
    if policy.startswith("fixed_"):  # it routes a trace's assignments: the same requests as a trace
        from tests.sim.test_sim_integration import gsp_as_trace

        cfg.workload = gsp_as_trace(cfg.workload, cfg.seed, cfg.cluster.num_workers)
    return cfg


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_runs_a_simulated_cell_end_to_end(conf_dir, policy):
    cfg = _cell(conf_dir, policy)
    result = run_cell(cfg)
    rec = result.records
    assert len(rec) == NUM_QUERIES and not rec["failed"].any()
    assert rec["worker"].between(0, cfg.cluster.num_workers - 1).all()
    assert (rec["finish_s"] >= rec["first_token_s"]).all() and (rec["first_token_s"] >= rec["arrival_s"]).all()
    assert rec["cached_tokens"].sum() > 0  # 4 shared system prompts: every policy gets some hits
    again = run_cell(_cell(conf_dir, policy))
    assert again.records.equals(rec)  # same config + seed -> identical records


def test_lbgr_ablations_run_end_to_end(conf_dir):
    for extra in (
        ["router.tracker=exact"],
        ["router.decay=drain", "router.learner=sgd"],
        ["router.oracle_output_len=true", "router.learner=none"],
    ):
        rec = run_cell(_cell(conf_dir, "lbgr_rlt", extra)).records
        assert len(rec) == NUM_QUERIES and not rec["failed"].any(), extra
