"""The benchmark's helpers (imported by the SGLang benchmark) run on a tiny trace; no timing asserted."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kvcache.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_kvcache", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_helpers_run_on_a_tiny_trace():
    b = load()
    trace = b.make_gsp_trace(num_groups=3, prompts_per_group=4, prefix_tokens=32, question_tokens=8)
    assert len(trace) == 12 and all(len(t) == 40 for t in trace)
    assert b.working_set_tokens(trace) == 3 * 32 + 12 * 8
    for policy in ("lru", "rlt"):
        assert b.run_ours(trace, 64, policy) > 0
        us, evicted = b.eviction_cost(trace, 64, policy, "token")
        assert evicted > 0 and us > 0


def test_baseline_rev_loads_the_policy_of_a_git_revision():
    b = load()
    trace = b.make_gsp_trace(num_groups=3, prompts_per_group=4, prefix_tokens=32, question_tokens=8)
    mod = b.eviction_module_at("HEAD")
    assert mod.RLTEviction is not b.make_cache(8, {"name": "rlt"}).policy.__class__
    us, evicted = b.eviction_cost(trace, 64, "rlt", "token", module=mod)
    assert evicted > 0 and us > 0
