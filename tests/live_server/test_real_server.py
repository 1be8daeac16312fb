"""The live path against real SGLang 0.5.23 servers on this CPU (tiny random-weight Llama).

Asserts on meta_info (prompt / completion / cached tokens) and on the servers' own eviction counts,
never on generated text (the weights are random). What runs:
- three servers started once for the module (RLT seed 1 twice, LRU), KV pool 2048 tokens each;
- RLT at work inside the server: a cyclic trace over more prefixes than fit, sent to each server
  directly: LRU never hits, RLT does, by the server's own eviction log lines;
- RLT reproducible inside the server: two fresh processes, same seed, same trace -> the same
  cached tokens request by request, and again after /flush_cache;
- the router service (LBGR, cache-aware, round-robin) and the real sglang-router 0.3.2 in front of
  two of those servers, the streaming client replaying a shrunk GSP.
The whole harness cell (servers started by the cell) and the faults are in test_real_cell.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from repro.backends.sglang.rlt_patch import eviction_log_stats
from tests.live_server.conftest import MARK_VAR, server_python, wait_no_orphans, watch
from tests.live_server.servers import flush, generate, running_servers

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(1800)]

KV_TOKENS = 2048
PREFIX_LEN = 400
NUM_PREFIXES = 6  # 6 x ~400 > 2048: the cycle cannot fit
ROUNDS = 3


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    python = server_python()
    mark = f"module-{os.getpid()}"
    old = os.environ.get(MARK_VAR)
    os.environ[MARK_VAR] = mark
    watch(mark)
    log_dir = tmp_path_factory.mktemp("servers")
    try:
        kinds = [("rlt_a", "rlt", 1), ("rlt_b", "rlt", 1), ("lru", "lru", 1),
                 ("lru_unified", "lru", 1, ["--radix-cache-backend", "sglang-default"])]
        with running_servers(python, log_dir, kinds, KV_TOKENS) as started:
            yield {s.name: s for s in started}
    finally:
        if old is None:
            os.environ.pop(MARK_VAR, None)
        else:
            os.environ[MARK_VAR] = old
    assert wait_no_orphans(mark) == [], "server processes outlived their stop"


def cyclic_trace() -> list[list[int]]:
    """ROUNDS rounds over NUM_PREFIXES prefixes, each request its prefix + a fresh 8-token question."""
    trace = []
    for r in range(ROUNDS):
        for p in range(NUM_PREFIXES):
            prefix = [1000 + p * 1000 + i for i in range(PREFIX_LEN)]
            question = [90000 + r * 100 + p * 10 + j for j in range(8)]
            trace.append(prefix + question)
    return trace


def replay_sequentially(url: str, trace) -> list[int]:
    cached = []
    for ids in trace:
        meta = generate(url, ids)
        assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 4, meta
        cached.append(int(meta["cached_tokens"]))
    return cached


def test_rlt_evicts_inside_the_server_and_beats_lru_on_a_cycle(servers):
    trace = cyclic_trace()
    for s in servers.values():
        flush(s.url)
    lru = replay_sequentially(servers["lru"].url, trace)
    rlt = replay_sequentially(servers["rlt_a"].url, trace)
    first_round = slice(0, NUM_PREFIXES)
    assert lru[first_round] == [0] * NUM_PREFIXES and rlt[first_round] == [0] * NUM_PREFIXES
    # LRU on a cycle longer than the cache: the prefix asked next is always the one just evicted
    assert sum(lru[NUM_PREFIXES:]) == 0, lru
    # RLT evicts uniformly among unmarked leaves: some prefixes survive a round (the paper's point)
    assert sum(rlt[NUM_PREFIXES:]) >= PREFIX_LEN, rlt
    # the servers' own counts: both evicted through the patched cache, RLT by its random draws
    lru_stats = eviction_log_stats(servers["lru"].log_text())
    rlt_stats = eviction_log_stats(servers["rlt_a"].log_text())
    assert lru_stats is not None and lru_stats["policy"] == "lru" and lru_stats["total"] > 0
    assert rlt_stats is not None and rlt_stats["policy"] == "rlt"
    assert rlt_stats["random"] > 0 and rlt_stats["resets"] >= 1, rlt_stats
    assert "Tree cache initialized: source=registered('repro_radix') impl=RadixCache" in servers["rlt_a"].log_text()


def test_rlt_is_reproducible_across_processes_and_flushes(servers):
    rng = np.random.default_rng(7)
    # 96 requests over 12 prefixes in random order: many evictions, in a different pattern than the cycle
    trace = []
    for _ in range(96):
        p = int(rng.integers(12))
        trace.append([2000 + p * 1000 + i for i in range(int(rng.integers(150, 450)))] +
                     [int(x) for x in rng.integers(50000, 60000, size=6)])
    flush(servers["rlt_a"].url)
    flush(servers["rlt_b"].url)
    a = replay_sequentially(servers["rlt_a"].url, trace)
    b = replay_sequentially(servers["rlt_b"].url, trace)
    assert eviction_log_stats(servers["rlt_b"].log_text())["resets"] >= 1
    assert a == b, f"same seed, same trace, two processes: cached tokens differ (sums {sum(a)} vs {sum(b)})"
    flush(servers["rlt_a"].url)
    assert replay_sequentially(servers["rlt_a"].url, trace) == a, "after /flush_cache the same trace differs"


def test_sglang_default_tree_evicts_like_the_plain_radix_cache_under_lru(servers):
    """SGLang 0.5.23 builds UnifiedRadixCache (a Rust tree core) by default; the patch and the paper's
    L-LRU baseline use the plain RadixCache. Same LRU policy, same traces (the cycle and a random
    mix), sent one request at a time: the two trees give the same cached tokens, request by request."""
    assert "impl=UnifiedRadixCache" in servers["lru_unified"].log_text()
    assert "impl=RadixCache" in servers["lru"].log_text()
    rng = np.random.default_rng(11)
    mixed = []
    for _ in range(60):
        p = int(rng.integers(10))
        mixed.append([3000 + p * 1000 + i for i in range(int(rng.integers(100, 500)))] +
                     [int(x) for x in rng.integers(50000, 60000, size=int(rng.integers(1, 40)))])
    for trace in (cyclic_trace(), mixed):
        flush(servers["lru"].url)
        flush(servers["lru_unified"].url)
        plain = replay_sequentially(servers["lru"].url, trace)
        unified = replay_sequentially(servers["lru_unified"].url, trace)
        assert sum(plain) > 0 or trace is not mixed
        assert plain == unified, [(i, a, b) for i, (a, b) in enumerate(zip(plain, unified)) if a != b][:10]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from tests.live_server.servers import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("config", overrides=["exp=live_cpu_gsp", *overrides])


@pytest.mark.parametrize("policy,router_impl", [
    ("lbgr_rlt", "ours"), ("cache_aware_rlt", "ours"), ("round_robin_rlt", "ours"), ("cache_aware_rlt", "sglang_router"),
])
def test_routers_in_front_of_real_servers(servers, tmp_path, policy, router_impl, test_mark):
    """Router (ours with three policies, or the real sglang-router) + streaming client over two real
    RLT servers: every request served, lengths and cached tokens from the servers' meta_info."""
    from repro.backends import assembly
    from repro.backends.sglang.client import ClientConfig, run_replay
    from repro.backends.sglang.planning import plan_cell
    from repro.backends.sglang.processes import ManagedProcess, wait_healthy
    from repro.confutil import to_plain
    from tests.live_server.conftest import router_python

    overrides = [f"policy={policy}", f"backend.router_impl={router_impl}", "workload.request_rate=4.0"]
    if router_impl == "sglang_router":
        overrides.append(f"backend.sglang_router.python={router_python()}")
    cfg = _compose(overrides)
    cell = assembly.assemble(cfg, components=False)
    plain = to_plain(cfg)
    plan = plan_cell(plain, list(cell.plan.capacities), cell.plan.seeds, tmp_path)
    real = [servers["rlt_a"].url, servers["rlt_b"].url]
    plan.bind_urls(dict(zip(plan.worker_urls, real)))
    for url in real:
        flush(url)
    router = ManagedProcess(plan.router)
    try:
        router.start()
        wait_healthy([router], 120.0)
        records, report = run_replay(cell.requests, plan.router_url, ClientConfig(**plan.client))
    finally:
        router.stop(10.0)
    assert report["num_failed"] == 0, report
    assert len(records) == len(cell.requests)
    prompt_lens = np.array([len(r.prompt_tokens) for r in cell.requests])
    assert (records["prompt_tokens"].to_numpy() == prompt_lens).all()
    assert (records["output_tokens"] == 4).all()
    assert (records["first_token_s"] <= records["finish_s"]).all()
    # GSP shares each group's system prompt: the servers' radix caches hit
    assert records["cached_tokens"].sum() > 0
    assert records["cached_tokens"].max() < prompt_lens.max()
    if router_impl == "ours":
        counts = records["worker"].value_counts().to_dict()
        assert set(counts) <= {0, 1}
        if policy.startswith("round_robin"):
            assert abs(counts.get(0, 0) - counts.get(1, 0)) <= 1, counts  # strict alternation
    assert wait_no_orphans(test_mark, 30.0) == [], "router processes outlived their stop"
