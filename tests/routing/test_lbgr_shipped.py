"""LBGR as shipped (repro/routing/lbgr_shipped.py) against a simple reference written here from the
rules of the authors' `eta_online_3d` (docs/ALGORITHMS.md §3 "LBGR as shipped").

The reference keeps things the obvious way: the 20 ms timer as a literal loop over tick times,
the prefix index as each worker's list of inserted texts (a worker's match = the longest common
prefix with any of them; true of the tree while nothing is trimmed), the remainder with exact
fractions, the RLS as the scalar intercept-only recursion. Every prediction, every choice, every
load and every intercept is compared exactly, event by event.
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.routing import LBGRShippedRouter
from repro.routing.lbgr_shipped import MaskedRLS, ShippedPrefixIndex, decayed_remainder, powi, whole_ms
from tests.routing.fakes import make_request

LAM, P0 = 0.992, 1.0e6


def _workers(m):
    return [SimpleNamespace(worker_id=i) for i in range(m)]


def _lcp(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Reference:
    """The rules, written plainly, on float seconds of the driver's clock."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.loads = [0] * m
        self.theta = [0.0] * m
        self.p = [P0] * m
        self.texts: list[list[str]] = [[] for _ in range(m)]
        self.next_tick_ms = 20
        self.pending: dict[int, tuple] = {}

    @staticmethod
    def ms(seconds: float) -> int:
        """Whole milliseconds (truncated; 1 ns of float error forgiven)."""
        return max(0, math.floor(seconds * 1000.0 + 1e-6))

    def timer_until(self, now_s: float) -> None:
        while self.next_tick_ms <= self.ms(now_s):  # the timer thread: every 20 ms, every worker
            self.loads = [v * 31 // 32 for v in self.loads]
            self.next_tick_ms += 20

    @staticmethod
    def base(uncached: int) -> float:
        return max(1.0, 1000.0 * (uncached / 1000.0))  # 1000 "ms" per 1000 uncached characters, >= 1

    def dispatch(self, rid: int, text: str, now_s: float):
        self.timer_until(now_s)
        preds, info = [], []
        for i in range(self.m):
            cached = max((_lcp(text, k) for k in self.texts[i]), default=0)
            b = self.base(len(text) - cached)
            preds.append(max(1.0, (b + self.loads[i]) + self.theta[i]))
            info.append((b, self.loads[i]))
        best = 0
        for i in range(1, self.m):
            if preds[i] + 1.0 < preds[best]:
                best = i
        b, load = info[best]
        inc = math.floor(b + 0.5)
        self.loads[best] += inc
        if text:
            self.texts[best].append(text)
        self.pending[rid] = (best, b, load, inc, now_s)
        return best, preds

    def _release(self, rid: int, now_s: float) -> int:
        w, _, _, inc, t0 = self.pending.pop(rid)
        ticks = self.ms(now_s - t0) // 20
        rem = inc if ticks <= 0 else math.floor(inc * Fraction(31, 32) ** ticks + Fraction(1, 2))
        self.loads[w] = max(0, self.loads[w] - rem)
        return w

    def complete(self, rid: int, now_s: float, latency_s: float) -> None:
        self.timer_until(now_s)
        w, b, load, _, _ = self.pending[rid]
        y = max(1.0, latency_s * 1000.0 - (b + load))
        k = self.p[w] / (LAM + self.p[w])
        self.theta[w] += k * (y - self.theta[w])
        self.p[w] = (self.p[w] - k * self.p[w]) / LAM
        self._release(rid, now_s)

    def abandon(self, rid: int, now_s: float) -> None:
        self.timer_until(now_s)
        self._release(rid, now_s)


def _router(m: int, **kw) -> LBGRShippedRouter:
    kw.setdefault("eviction_interval_secs", 0)  # the reference has no trim
    r = LBGRShippedRouter(**kw)
    r.reset(_workers(m), seed=0)
    return r


def _check_same(router: LBGRShippedRouter, ref: Reference) -> None:
    assert router.loads == ref.loads
    assert [mdl.theta[0] for mdl in router.models] == ref.theta
    assert [mdl.p[0][0] for mdl in router.models] == ref.p


def replay(m: int, events) -> tuple[int, int]:
    """events: ("dispatch", rid, text, t_us) | ("complete", rid, t_us, latency_s) | ("abandon", rid, t_us).
    Returns (dispatches, completions) checked."""
    router, ref = _router(m), Reference(m)
    reqs = {}
    n_disp = n_done = 0
    for ev in events:
        if ev[0] == "dispatch":
            _, rid, text, t_us = ev
            reqs[rid] = make_request(rid, [1, 2, 3], text=text, arrival_s=t_us / 1e6)
            got = router.select_worker(reqs[rid], [], t_us / 1e6)
            want, preds = ref.dispatch(rid, text, t_us / 1e6)
            assert router.last_predictions == preds, (rid, t_us)
            assert got == want, (rid, t_us, preds)
            n_disp += 1
        elif ev[0] == "complete":
            _, rid, t_us, lat = ev
            w = ref.pending[rid][0]
            router.on_request_complete(reqs[rid], w, lat, lat, 0, t_us / 1e6)
            ref.complete(rid, t_us / 1e6, lat)
            n_done += 1
        else:
            _, rid, t_us = ev
            router.on_request_abandoned(reqs[rid], ref.pending[rid][0], t_us / 1e6)
            ref.abandon(rid, t_us / 1e6)
        _check_same(router, ref)
    return n_disp, n_done


# ---------------------------------------------------------------- random sequences (hypothesis)
PREFIXES = ["", "sys-a:", "sys-b:" * 40, "x" * 1500, "sys-a:ab"]
_gap_us = st.one_of(
    st.integers(0, 3_000),  # sub-tick
    st.sampled_from([19_999, 20_000, 20_001, 39_999, 40_000]),  # tick edges
    st.integers(0, 200_000),
    st.integers(0, 5_000_000),  # long idle stretches: loads decay to zero
)
_step = st.tuples(
    st.sampled_from(["dispatch", "dispatch", "complete", "abandon"]),
    st.integers(0, len(PREFIXES) - 1),
    st.text("ab", max_size=12),
    _gap_us,
    st.integers(0, 10**9),  # which pending request; latency noise
)


def _events(steps):
    t, rid, pending, out = 0, 0, [], []
    for kind, p, suffix, gap, pick in steps:
        t += gap
        if kind == "dispatch" or not pending:
            out.append(("dispatch", rid, PREFIXES[p] + suffix, t))
            pending.append((rid, t))
            rid += 1
            continue
        r, t0 = pending.pop(pick % len(pending))
        if kind == "complete":
            lat = (t - t0) / 1e6 + (pick % 7) * 0.013  # latencies above and below base + load
            out.append(("complete", r, t, lat))
        else:
            out.append(("abandon", r, t))
    return out


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 5), steps=st.lists(_step, min_size=1, max_size=80))
def test_random_sequences_match_the_reference_decision_for_decision(m, steps):
    replay(m, _events(steps))


def test_a_recorded_simulated_cell_replays_decision_for_decision(conf_dir, monkeypatch):
    """A small GSP cell on the simulator, its dispatches and completions recorded as the router saw
    them, then replayed through the reference: the same choices and predictions throughout."""
    from hydra import compose, initialize_config_dir

    from repro.backends.sim import run_cell
    from repro.routing.base import request_text

    log = []
    sel, done = LBGRShippedRouter.select_worker, LBGRShippedRouter.on_request_complete

    def select(self, request, workers, now_s):
        w = sel(self, request, workers, now_s)
        log.append(("dispatch", request.id, request_text(request), now_s, w, list(self.last_predictions)))
        return w

    def complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        log.append(("complete", request.id, now_s, latency_s))
        return done(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s)

    monkeypatch.setattr(LBGRShippedRouter, "select_worker", select)
    monkeypatch.setattr(LBGRShippedRouter, "on_request_complete", complete)
    over = [
        "policy=lbgr_shipped_lru",
        "workload.num_queries=160",
        "workload.num_groups=6",
        "workload.prompts_per_group=null",
        "workload.system_prompt_len_range=[200,900]",
        "workload.request_rate=40.0",
        "cluster.kv_cache_tokens=4000",
        "router.eviction_interval_secs=0",
    ]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name="config", overrides=over)
    rec = run_cell(cfg).records
    assert len(rec) == 160 and not rec["failed"].any()
    m = int(cfg.cluster.num_workers)
    ref = Reference(m)
    used, beaten = set(), 0
    for ev in log:
        if ev[0] == "dispatch":
            _, rid, text, now_s, w, preds = ev
            want, ref_preds = ref.dispatch(rid, text, now_s)
            assert (w, preds) == (want, ref_preds), rid
            used.add(w)
            beaten += want != 0
        else:
            _, rid, now_s, lat = ev
            ref.complete(rid, now_s, lat)
    assert len(used) > 1 and beaten > 0  # the loads and the cache both moved choices
    assert sum(e[0] == "complete" for e in log) == 160


# ---------------------------------------------------------------- units
def test_decay_by_ticks_equals_a_literal_20ms_timer_loop():
    r = _router(3)
    r.loads = [10**6, 37, 0]
    timer = list(r.loads)
    t_ms = 0
    for q in [0, 5, 19, 20, 21, 39, 40, 41, 100, 1000, 1001, 1019, 1020, 5000, 60000, 60020]:
        while t_ms + 20 <= q:  # the thread: sleep 20 ms, floor(load * 31 / 32)
            t_ms += 20
            timer = [v * 31 // 32 for v in timer]
        r.advance(q / 1000)
        assert r.loads == timer, q
    assert timer == [0, 0, 0]


def test_tick_grid_is_the_clocks_origin_and_float_seconds_land_on_whole_ms():
    r = _router(1)
    r.loads = [32]
    r.advance(0.0199999)  # 19.9999 ms: no tick
    assert r.loads == [32]
    r.advance(0.02)  # exactly 20 ms (0.02 * 1000 is not exact in binary; counted as 20)
    assert r.loads == [31]
    r.advance(0.06)  # ticks at 40 and 60 ms
    assert r.loads == [29]
    r.advance(0.05)  # a clock going back changes nothing
    assert r.loads == [29]
    assert [whole_ms(x) for x in (0.07, 1.005, 0.0009999, -1.0)] == [70, 1005, 0, 0]


def test_remainder_is_rounded_from_whole_ms_since_dispatch_half_away_from_zero():
    assert decayed_remainder(100, 19) == 100  # under one tick: all of it
    assert decayed_remainder(100, 20) == 97  # 96.875
    assert decayed_remainder(48, 20) == 47  # 46.5: Rust rounds halves away from zero
    assert decayed_remainder(16, 20) == 16  # 15.5
    assert decayed_remainder(1000, 10_000) == 0  # 500 ticks
    for n in range(0, 200, 7):
        exact = Fraction(31, 32) ** n
        assert abs(Fraction(powi(31 / 32, n)) - exact) <= exact * Fraction(n + 1, 2**52)


def test_remainder_differs_from_the_timers_floor_and_the_load_saturates_at_zero():
    r = _router(1)
    req = make_request(0, [1], text="q" * 1000)
    r.select_worker(req, [], 0.001)
    assert r.loads == [1000]
    r.advance(0.200)  # 10 ticks of the timer, each floored: 723 (1000 * (31/32)^10 = 727.98)
    assert r.loads == [723]
    # 199 ms since the dispatch at 1 ms: 9 ticks of its own, round(751.46) = 751 > 723: saturates
    r.on_request_complete(req, 0, 0.199, 0.1, 0, 0.200)
    assert r.loads == [0]
    r.select_worker(req2 := make_request(1, [1], text="r" * 64), [], 0.205)
    r.select_worker(make_request(2, [1], text="s" * 1000), [], 0.206)
    # timer ticks at 220 and 240 ms floor 1064 twice; 45 ms since 205 ms: 2 ticks, round(60.06) = 60 off
    r.on_request_abandoned(req2, 0, 0.250)
    assert r.loads == [(1064 * 31 // 32) * 31 // 32 - 60]


def test_base_is_one_unit_per_uncached_character_clamped_at_one():
    r = _router(2)
    a = make_request(0, [1], text="p" * 500 + "A" * 20)
    assert r.select_worker(a, [], 0.0) == 0 and r.last_predictions == [520.0, 520.0]
    b = make_request(1, [1], text="p" * 500 + "B" * 20)  # 500 cached on worker 0, load 520
    r.select_worker(b, [], 0.0)
    assert r.last_predictions == [20.0 + 520.0, 520.0]
    r2 = _router(1)
    empty = make_request(2, [1], text="")
    r2.select_worker(empty, [], 0.0)
    assert r2.last_predictions == [1.0] and r2.loads == [1]  # nothing uncached still costs 1
    again = make_request(3, [1], text="zz")
    r2.select_worker(again, [], 0.0)
    r2.select_worker(make_request(4, [1], text="zz"), [], 0.0)
    assert r2.last_predictions == [1.0 + 3.0]  # fully cached: base 1, load 1 + 2


def test_target_is_clamped_at_one_and_rls_learns_the_intercept_only():
    m = MaskedRLS(LAM, P0)
    m.update(5000.0)
    assert m.theta[0] == pytest.approx(5000.0 * P0 / (P0 + LAM), rel=1e-15) and m.theta[1:] == [0.0, 0.0, 0.0]
    assert m.p[0][0] == pytest.approx(P0 / (LAM + P0)) and m.p[1][1] == P0 / LAM
    for _ in range(3000):
        m.update(100.0)
    assert m.theta[0] == pytest.approx(100.0) and m.p[0][0] == pytest.approx(1 - LAM)  # gain -> 1 - lambda
    r = _router(1)
    req = make_request(0, [1], text="w" * 300)
    r.select_worker(req, [], 0.0)
    r.on_request_complete(req, 0, 0.050, 0.01, 0, 0.050)  # 50 ms < base 300: the target is 1
    assert r.models[0].theta[0] == pytest.approx(1.0, rel=1e-5)


def test_unlearned_rows_overflow_and_a_nan_prediction_reads_as_one():
    n, p = 0, P0
    while p != math.inf:
        p /= LAM
        n += 1
    assert n == 86_648
    m = MaskedRLS(LAM, P0)
    for _ in range(n):
        m.update(10.0)
    assert m.p[1][1] == math.inf and m.theta[0] == pytest.approx(10.0)
    m.update(10.0)
    assert math.isnan(m.theta[0])
    r = _router(2)
    r.models[1] = m
    r.select_worker(make_request(0, [1], text="x" * 50), [], 0.0)
    assert r.last_predictions == [50.0, 1.0]  # Rust's max(NaN, 1) = 1: worker 1 looks cheapest


@pytest.mark.parametrize(
    "loads, want",
    [
        ([10, 9], 0),  # better by exactly 1: not enough
        ([10, 8], 1),  # better by 2
        ([10, 9, 9], 0),
        ([100, 99, 98, 97], 2),  # 98 beats 100 by 2; 97 beats 98 by only 1
        ([5, 5, 5], 0),  # ties: the first in order
        ([50, 40, 45, 38, 39], 3),
    ],
)
def test_a_later_worker_wins_only_by_more_than_one(loads, want):
    r = _router(len(loads))
    r.loads = list(loads)
    assert r.select_worker(make_request(0, [1], text=""), [], 0.0) == want
    assert r.last_predictions == [1.0 + v for v in loads]


def test_prefix_index_stamps_the_whole_path_and_matches_per_worker_without_touching():
    idx = ShippedPrefixIndex([0, 1])
    idx.insert("abcdef", 0, 5)
    idx.insert("abcxyz", 1, 7)
    idx.insert("ab", 0, 9)  # splits "abc" into "ab" + "c"; stamps root and "ab" only
    tree = idx.tree
    stamps = {}
    stack = [("", tree.root)]
    while stack:
        path, node = stack.pop()
        stamps[path + node.key] = dict(node.tenants)
        stack += [(path + node.key, c) for c in node.children.values()]
    assert stamps[""] == {0: 9, 1: 7}
    assert stamps["ab"] == {0: 9, 1: 7} and stamps["abc"] == {0: 5, 1: 7}
    assert stamps["abcdef"] == {0: 5} and stamps["abcxyz"] == {1: 7}
    assert idx.match_len("abcdeZ", 0) == 5 and idx.match_len("abcdeZ", 1) == 3  # partial inside a node counts
    assert idx.match_len("abcxy", 0) == 3 and idx.match_len("q", 0) == 0
    assert stamps == _stamps(idx)  # matching stamped nothing
    assert idx.size(0) == 6 and idx.size(1) == 6


def _stamps(idx):
    out, stack = {}, [("", idx.tree.root)]
    while stack:
        path, node = stack.pop()
        out[path + node.key] = dict(node.tenants)
        stack += [(path + node.key, c) for c in node.children.values()]
    return out


def test_trim_runs_on_the_60s_grid_least_recent_first():
    r = _router(1, eviction_interval_secs=60, max_tree_size=10)
    for i, (text, t) in enumerate([("old-" + "o" * 6, 1.0), ("new-" + "n" * 6, 2.0)]):
        req = make_request(i, [1], text=text)
        r.select_worker(req, [], t)
        r.on_request_complete(req, 0, 0.5, 0.1, 0, t + 0.5)
    assert r.index.size(0) == 20 and r.trims_run == 0
    r.select_worker(make_request(9, [1], text="old-oooooo"), [], 59.999)  # "old-" touched last
    assert r.trims_run == 0 and r.index.size(0) == 20
    r.advance(60.0)
    assert r.trims_run == 1 and r.index.size(0) == 10
    assert r.index.match_len("new-nnnnnn", 0) == 0 and r.index.match_len("old-oooooo", 0) == 10
    r.advance(119.0)
    assert r.trims_run == 1
    r.advance(300.0)  # slots at 120, 180, 240, 300 missed: one trim (it is idempotent)
    assert r.trims_run == 2


def test_completion_inserts_the_prompt_again_so_a_trimmed_text_comes_back():
    r = _router(2, eviction_interval_secs=60, max_tree_size=10)
    a, b = make_request(0, [1], text="a" * 10), make_request(1, [1], text="b" * 10)
    r.loads = [0, 10**6]  # keep both on worker 0
    assert r.select_worker(a, [], 1.0) == 0 and r.select_worker(b, [], 2.0) == 0
    r.advance(60.0)  # the trim drops worker 0's least recent text: a's
    assert r.index.match_len(a.text, 0) == 0 and r.index.match_len(b.text, 0) == 10
    r.on_request_complete(a, 0, 59.5, 1.0, 0, 60.5)
    assert r.index.match_len(a.text, 0) == 10 and r.index.match_len(a.text, 1) == 0
    assert _stamps(r.index)["a" * 10] == {0: 60_500}
    r.on_request_abandoned(b, 0, 61.0)  # a failure inserts nothing and learns nothing
    assert _stamps(r.index)["b" * 10] == {0: 2_000} and r.models[0].p[0][0] < 1.0
    assert r.models[0].p[1][1] == P0 / LAM  # one update (a's), not two


@pytest.mark.slow
def test_routes_a_cell_of_emulated_sglang_workers_behind_the_router_service(tmp_path):
    """backend=sglang: the router service builds it with build_router and routes with it (~8 s)."""
    from hydra import compose, initialize_config_dir

    from repro.backends.sglang import backend
    from repro.metrics.summary import summarize
    from tests.routing.conftest import CONF

    over = ["backend=sglang", "backend.emulate=true", "backend.time_scale=20", "policy=lbgr_shipped_lru",
            "workload.num_queries=48", "cluster.num_workers=2", "cluster.kv_cache_tokens=30000",
            f"results_dir={tmp_path}", "exp_name=live_test"]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=over)
    res = backend.run_cell(cfg)
    s = summarize(res.records)
    assert s["num_requests"] == 48 and s["num_failed"] == 0 and 0 < s["hit_rate"] < 1
    assert res.provenance["router_service"]["callbacks"] == 48 and res.timings["routing"]["decisions"] == 48
    assert set(res.records["worker"]) == {0, 1}
