"""backend=sglang for the harness: config checks, signature identity, whole cells on emulated workers,
and the CI check that emulated SGLang workers reproduce the simulator's hit rate on the fig2 GSP cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.backends.sglang import backend

from live_helpers import CONF, need_parts


def _base(**backend_over):
    b = {"name": "sglang", "emulate": True, "time_scale": 5.0, "router_impl": "ours"}
    b.update(backend_over)
    return {
        "seed": 0,
        "cluster": {"num_workers": 4},
        "model": {"tensor_parallel": 1, "hf_id": "meta-llama/Llama-3.1-8B-Instruct"},  # real servers need a model to load
        "router": {"name": "lbgr", "tracker": "approximate"},
        "eviction": {"name": "rlt", "granularity": "node"},
        "backend": b,
    }


def test_a_good_config_has_no_errors():
    assert backend.validate_cell(_base()) == []
    assert backend.validate_cell(_base(emulate=False, time_scale=1.0)) == []


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda c: c["backend"].update(colour="red"), "unknown keys ['colour']"),
        (lambda c: c["backend"].update(timeouts={"request": 5}), "backend.timeouts: unknown keys ['request']"),
        (lambda c: c["backend"].update(emulate="yes"), "backend.emulate must be true or false"),
        (lambda c: c["backend"].update(time_scale=0), "time_scale must be a number > 0"),
        (lambda c: c["backend"].update(emulate=False), "applies to emulated workers only"),
        (lambda c: c["backend"].update(router_impl="nginx"), "router_impl must be"),
        (lambda c: c["backend"].update(router_impl="sglang_router"), "use router_impl=ours"),
        (lambda c: (c["backend"].update(router_impl="sglang_router"),
                    c["router"].update(name="cache_aware", eviction_interval_secs=0)), "cannot turn trimming off"),
        (lambda c: (c["backend"].update(router_impl="sglang_router"),
                    c["router"].update(name="cache_aware", eviction_interval_secs=0.5)), "whole number"),
        (lambda c: (c["backend"].update(router_impl="sglang_router"),
                    c["router"].update(name="cache_aware", generation="le_0_2_3")), "runs sglang-router 0.3.2"),
        (lambda c: (c["backend"].update(router_impl="sglang_router"),
                    c["router"].update(name="cache_aware", generation="smg_1_13")), "runs sglang-router 0.3.2"),
        (lambda c: c["router"].update(tracker="exact"), "tracker=exact"),
        (lambda c: c["eviction"].update(name="opt"), "does not run on backend sim"),
        (lambda c: (c["backend"].update(emulate=False, time_scale=1.0), c["eviction"].update(name="mru")),
         "unknown eviction policy 'mru'"),
        (lambda c: (c["backend"].update(emulate=False, time_scale=1.0), c["eviction"].update(name="opt")),
         "does not run on backend sglang"),
        (lambda c: (c["backend"].update(emulate=False, time_scale=1.0), c["eviction"].update(granularity="token")),
         "SGLang evicts whole radix-tree nodes"),
        (lambda c: c["backend"].update(timeouts={"request_s": -1}), "timeouts.request_s must be a number > 0"),
        (lambda c: c["backend"].update(emulate=False, time_scale=1.0, gpus=[0, 1]), "lists 2 GPUs"),
        (lambda c: c["backend"].update(gpus="0,1"), "backend.gpus must be null or a list"),
        (lambda c: c["backend"].update(client={"send_reference_output": "maybe"}), "send_reference_output"),
        (lambda c: c["backend"].update(router_service={"max_retries": -2}), "max_retries"),
        (lambda c: c["backend"].update(emulator={"fault": "meteor"}), "fault 'meteor'"),
    ],
)
def test_bad_configs_are_named_before_anything_runs(change, fragment):
    cfg = _base()
    change(cfg)
    errs = backend.validate_cell(cfg)
    assert any(fragment in e for e in errs), errs


def test_identity_leaves_out_where_the_run_happens():
    a = _base(host="127.0.0.1", gpus=[0, 1, 2, 3], log_dir="/tmp/a", python="/usr/bin/python3")
    b = _base(host="0.0.0.0", gpus=None, log_dir=None, python=None)
    assert backend.identity(a) == backend.identity(b)
    assert backend.identity(_base(time_scale=5.0)) != backend.identity(_base(time_scale=10.0))


def test_the_config_file_lists_every_known_key():
    import yaml

    cfg = yaml.safe_load((CONF / "backend/sglang.yaml").read_text())
    from repro.backends.sglang.config import BACKEND_KEYS, SECTION_KEYS

    assert set(cfg) == BACKEND_KEYS
    for section, keys in SECTION_KEYS.items():
        assert set(cfg[section]) == keys, section
    full = _base()
    full["backend"] = cfg
    assert backend.validate_cell(full) == []


def _compose(overrides):
    """The composed root config."""
    need_parts()
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides)


def test_run_cell_on_emulated_workers_writes_logs_in_the_cell_folder(tmp_path):
    from repro.metrics.summary import summarize

    cfg = _compose(["backend=sglang", "backend.emulate=true", "backend.time_scale=20", "policy=lbgr_rlt",
                    "workload.num_queries=48", "cluster.num_workers=2", "cluster.kv_cache_tokens=30000",
                    f"results_dir={tmp_path}", "exp_name=live_test"])
    res = backend.run_cell(cfg)
    s = summarize(res.records)
    assert s["num_requests"] == 48 and s["num_failed"] == 0 and 0 < s["hit_rate"] < 1
    log_dir = Path(res.timings["log_dir"])
    assert log_dir == backend.cell_log_dir(cfg) and log_dir.parent.parent.name == "live_test"
    assert (log_dir / "router.log").is_file() and (log_dir / "client_report.json").is_file()
    prov = res.provenance
    assert prov["backend"] == "sglang" and prov["emulate"] is True and prov["ran_on"].startswith("emulated")
    assert prov["kv_capacity_tokens"] == [30000, 30000] and prov["router_service"]["callbacks"] == 48
    json.dumps(prov)  # summary.json-able
    assert res.timings["routing"]["decisions"] == 48


def test_bad_input_fails_before_any_process_starts(tmp_path):
    cfg = _compose(["backend=sglang", "backend.emulate=true", "workload.num_queries=8",
                    "cluster.kv_cache_tokens=100", f"results_dir={tmp_path}"])
    with pytest.raises(ValueError, match="more than a worker's whole KV cache"):
        backend.run_cell(cfg)
    assert not any(tmp_path.rglob("*.log"))
    cfg = _compose(["backend=sglang", "backend.time_scale=3", f"results_dir={tmp_path}"])
    with pytest.raises(ValueError, match="applies to emulated workers only"):
        backend.run_cell(cfg)


# The fig2 GSP cell (conf/exp/fig2_main.yaml: 4 workers, 12 req/s, 4 output tokens, random order,
# Llama-3.1-8B on L40), with fewer queries so that CI stays within a minute; time_scale 5 (the
# emulated workers run five times faster than real time).
FIG2_GSP = ["exp=fig2_main", "protocol=text", "workload=gsp", "seed=0", "workload.num_queries=512", "backend=sglang",
            "backend.emulate=true", "backend.time_scale=5"]


def _assert_live_hit_rate_matches_sim(overrides, tmp_path, live_runs: int = 3, sim_jitter_runs: int = 7):
    """The mean hit rate of `live_runs` emulated-SGLang runs is within 2 points, plus two standard
    errors of the difference of means, of the mean of the simulator's exact run and its
    `sim_jitter_runs` jittered runs.

    One live run against the exact simulator is not a fair test: this cell's hit rate moves with
    timing alone. Measured on the 512-query CacheAware+LRU cell: simulator 0.660 exact,
    0.639-0.692 with arrivals jittered by ~20 ms; live 0.646-0.682 over 5 runs (one CI run failed
    a 2-point single-run bound at 0.680 vs 0.660). A systematic gap still fails."""
    import statistics

    import repro.backends.sim as sim_backend
    from repro.metrics.summary import summarize

    lives = []
    for k in range(live_runs):
        cell = backend.run_cell(_compose(overrides + [f"results_dir={tmp_path / str(k)}"]))
        res = summarize(cell.records)
        assert res["num_failed"] == 0, res
        # alive workers: stall exclusion never overrides the router here (router_service/stall.py)
        stalls = json.loads((Path(cell.timings["log_dir"]) / "router_stats.json").read_text())["stall"]
        assert stalls == {"exclusions": 0, "diverted": 0}, stalls
        lives.append(res)
    cfg = _compose(overrides)
    exact = summarize(sim_backend.run_cell(cfg).records)
    assert {r["num_requests"] for r in lives} == {exact["num_requests"]}, (lives, exact)
    live_rates = [r["hit_rate"] for r in lives]
    sims = [exact["hit_rate"]] + _sim_hit_rates_with_jitter(cfg, runs=sim_jitter_runs)
    se = (statistics.variance(live_rates) / len(live_rates) + statistics.variance(sims) / len(sims)) ** 0.5
    gap = abs(statistics.fmean(live_rates) - statistics.fmean(sims))
    assert gap <= 0.02 + 2.0 * se, (live_rates, sims, se)


# live_heavy (its own .ci/run step, make test-live-heavy): 3 live runs of 512 queries plus 8 simulator runs, ~45-70 s.
# Its hit rate moves with CPU load: wall-clock delays (HTTP hops, Python scheduling of 4 worker processes, the
# router and the client on 2 cores) land on the emulated clock x time_scale (5), always late. Requests then queue
# longer before admission, where the hit is counted, so more of their shared prefixes are already cached, and
# batching and load-aware routing change; the simulator's jitter (|N(0, 20 ms)| on arrivals) models only part of
# that. Measured at load average ~4.5 on 2 cores: live 0.700-0.710 vs simulator 0.639-0.692 (fails the bound).
@pytest.mark.live_heavy
def test_emulated_sglang_hit_rate_matches_the_simulator_on_the_fig2_gsp_cell(tmp_path):
    _assert_live_hit_rate_matches_sim(FIG2_GSP + ["policy=cache_aware_lru"], tmp_path)


def _sim_hit_rates_with_jitter(cfg, runs: int = 5, jitter_s: float = 0.02) -> list[float]:
    """The simulator on the same cell with every arrival delayed by |N(0, jitter_s)|: how much the
    cell's hit rate moves with timing alone (the live path adds ~10-20 ms of wall time per request,
    x time_scale on the emulated clock)."""
    import dataclasses

    import numpy as np

    from repro.backends import assembly
    from repro.metrics.summary import summarize
    from repro.sim import SimCluster

    requests = assembly.assemble(cfg, components=False).requests
    out = []
    for j in range(runs):
        rng = np.random.default_rng(1000 + j)
        moved = sorted((dataclasses.replace(r, arrival_s=r.arrival_s + abs(rng.normal(0.0, jitter_s)))
                        for r in requests), key=lambda r: r.arrival_s)
        cell = assembly.assemble(cfg)  # fresh caches and router for each run
        plan = cell.plan
        assembly.validate_requests(moved, plan.capacities)
        sim = SimCluster(moved, cell.caches, cell.cost_model, cell.router, plan.scheduler, plan.eviction_name,
                         plan.seeds.router)
        out.append(summarize(sim.run().records)["hit_rate"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["cache_aware_lru", "lbgr_rlt"])
@pytest.mark.parametrize("kv_cache_tokens", [None, 40000])
def test_emulated_hit_rate_full_fig2_gsp_cell(policy, kv_cache_tokens, tmp_path):
    """The whole 1024-query cell, with the fig2 config's capacity and with a tight one, by the same
    comparison of means as the default test. LBGR+RLT's routing reacts to measured latencies, so
    its hit rate moves with timing most: with the tight cache by several points from run to run
    (measured: simulator 0.808 exact, 0.826-0.847 jittered; live 0.813-0.857 over 5 runs; after
    the cost-model refit live 0.815, 0.760, 0.847 and one jittered simulator run 0.737)."""
    over = [o for o in FIG2_GSP if not o.startswith("workload.num_queries")] + [f"policy={policy}"]
    if kv_cache_tokens is not None:
        over.append(f"cluster.kv_cache_tokens={kv_cache_tokens}")
    _assert_live_hit_rate_matches_sim(over, tmp_path)
