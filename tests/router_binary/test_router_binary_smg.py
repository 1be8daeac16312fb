"""Our `generation: smg_1_13` cache-aware rule against the real smg 1.13.0 binary (make router-env),
decision by decision, in the scenario families of 0.3.2's parity tests (test_router_binary_parity.py).

The binary breaks every load tie uniformly at random (its thread RNG), so where our rule finds a
tie (`last_ties`) the check is that the real pick is one of the tied workers, and both our
routers continue with the real pick (`pick_tie`); everywhere else the pick must be equal. Every
decision's branch is also read from the binary's debug log (`Cache-aware selection branch=...`)
and must equal ours. Rules the binary must be seen to reject run beside ours step by step (real
loads in, real decision committed) and must each decide otherwise somewhere: 0.3.2's rule,
ties by (load, processed, index) as the issue read the source, a margin without the 2-sigma
cap, the cap not rounded up, and a per-worker tree budget. Run: `make test-router-binary` (pytest -m router_binary).
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from repro.routing import CacheAwareRouter
from repro.routing.cache_aware import ids_key
from tests.router_binary.binary_harness import Driver, router_python
from tests.router_binary.test_router_binary_parity import MULTIBYTE, gsp, wait_trim, with_router
from tests.routing.fakes import make_views

pytestmark = [pytest.mark.router_binary, pytest.mark.timeout(600)]

BINARY = "smg_1_13"
PY = None
NO_TRIM = ["--eviction-interval-secs", "3600"]
REPORT: list[str] = []
# our branch -> the binary's log name
REAL_BRANCH = {"hit": "tree_match", "spill": "spill", "low_match_tied": "expected_wait_fallback",
               "low_match_untied": "expected_wait_fallback"}


@pytest.fixture(autouse=True)
def _smg_venv():
    """A skip in set-up (not at collection), so that under CI=true tests/conftest.py fails it."""
    global PY
    PY = PY or router_python(BINARY)
    if PY is None:
        pytest.skip("smg 1.13.0 venv missing: run `make router-env`")


class IssueTies(CacheAwareRouter):
    """Variant: ties by (load, processed requests, index), as issue 30 read smg's source."""

    def reset(self, workers, seed):
        super().reset(workers, seed)
        self.processed = [0] * self.num_workers
        self.pick_tie = lambda ties: min(ties, key=lambda w: (self.processed[w], w))

    def commit(self, key, worker):
        super().commit(key, worker)
        self.processed[worker] += 1


class NoSigmaCap(CacheAwareRouter):
    """Variant: the spill margin is balance_abs_threshold itself (smg 1.9's source)."""

    def _spill_margin(self, mean):
        return self.balance_abs_threshold


class UnroundedSigma(CacheAwareRouter):
    """Variant: the 2-sigma cap as smg 1.13's help text states it, not rounded up to whole requests."""

    def _spill_margin(self, mean):
        return min(self.balance_abs_threshold, max(4.0, 2.0 * math.sqrt(mean)))


class PerWorkerBudget(CacheAwareRouter):
    """Variant: max_tree_size per worker (0.3.2's trim) under smg's choice rule."""

    def _trim(self):
        self.tree.evict_tenant_by_size(self.max_tree_size)


VARIANTS = {
    "v0_3_2_rule": (CacheAwareRouter, {"generation": "v0_3_2"}),
    "ties_load_processed_index": (IssueTies, {}),
    "margin_without_sigma_cap": (NoSigmaCap, {}),
    "sigma_cap_not_rounded_up": (UnroundedSigma, {}),
    "per_worker_tree_budget": (PerWorkerBudget, {}),
}


class SmgPair:
    """`step` and `closed` copies of our smg rule in the real router's epoch, plus variants."""

    def __init__(self, d: Driver, cfg: dict, variants=tuple(VARIANTS)):
        self.d = d
        m = d.workers.n
        epochs = d.router.init_epochs()  # start-up's empty-key inserts

        def make(cls=CacheAwareRouter, **extra):
            r = cls(match_on="text", worker_order="index", **{**cfg, "generation": BINARY, **extra})
            r.reset(make_views(m), seed=0)
            r.tree.epoch = epochs
            return r

        self.step, self.closed = make(), make()
        self.variants = {name: make(VARIANTS[name][0], **VARIANTS[name][1]) for name in variants}
        self.differs = {name: 0 for name in self.variants}
        self.ours_branches: list[str] = []
        self.decisions = self.step_agree = self.closed_agree = self.random_ties = 0
        self.branches: dict[str, int] = {}
        self.disagreements: list = []

    async def send(self, body: dict, key: str, now_s: float = 0.0) -> None:
        d = self.d
        loads = await d.real_loads()
        real = await d.send(body)

        def replay(ties):  # the binary drew at random among `ties`: continue with its pick
            return real if real in ties else ties[0]

        picks = {}
        for name, r in self.variants.items():
            r.loads = list(loads)
            if name != "ties_load_processed_index":
                r.pick_tie = replay
            picks[name] = r.decide(key, now_s)
            r.commit(key, real)
            self.differs[name] += picks[name] != real
        step, closed = self.step, self.closed
        step.loads = list(loads)
        step.pick_tie = closed.pick_tie = replay
        s = step.decide(key, now_s)
        branch, s_ties = step.last_branch, step.last_ties
        c = closed.route_key(key, now_s)
        step.commit(key, real)
        self.decisions += 1
        self.step_agree += s == real
        self.closed_agree += c == real
        self.random_ties += bool(s_ties)
        self.branches[branch] = self.branches.get(branch, 0) + 1
        self.ours_branches.append(branch)
        if s != real or c != real:
            self.disagreements.append((d.k - 1, branch, real, s, c, s_ties, loads, key[:30]))

    async def release_some(self, rng: random.Random, p: float) -> None:
        await self.d.release([r for r in list(self.d.in_flight) if rng.random() < p], self.closed)

    async def drain(self) -> None:
        await self.d.drain(self.closed)

    def line(self, name: str) -> str:
        return (f"smg {name}: {self.decisions} decisions, step-by-step {self.step_agree}/{self.decisions}, "
                f"closed-loop {self.closed_agree}/{self.decisions} ({self.random_ties} random ties, the real "
                f"pick among ours), branches {dict(sorted(self.branches.items()))}, rules the binary rejects "
                f"(decisions they would change): {self.differs}")

    def check(self, name: str, branches: set[str], must_differ=()) -> None:
        REPORT.append(self.line(name))
        print(REPORT[-1])
        assert self.decisions >= 100
        assert self.step_agree == self.decisions and self.closed_agree == self.decisions, (
            f"{self.line(name)}; first disagreements (k, branch, real, step, closed, ties, loads, key): "
            f"{self.disagreements[:5]}")
        missing = branches - set(self.branches)
        assert not missing, f"{name}: branches never taken: {missing} ({self.branches})"
        self.d.router._scan()
        real_branches = self.d.router.branches
        ours = [REAL_BRANCH[b] for b in self.ours_branches]
        assert real_branches == ours, next(
            (f"decision {i}: the binary logged {r}, ours {o}" for i, (r, o) in enumerate(zip(real_branches, ours))
             if r != o), f"{len(real_branches)} logged decisions, {len(ours)} ours")
        assert self.step.tree.hash_order_choices == 0, "a decision depended on the binary's per-node hash order"
        same = [n for n in must_differ if self.differs[n] == 0]
        assert not same, f"{name}: a rule the binary rejects decided the same every time: {same} ({self.differs})"


def run(tmp_path, m, args, body):
    asyncio.run(with_router(tmp_path, m, "cache_aware", args, body, python=PY, binary=BINARY))


async def gsp_traffic(pair: SmgPair, requests, rng, p_release=0.3, to_body=None):
    for q in requests:
        body, key = to_body(q) if to_body else ({"text": q.text}, q.text)
        await pair.send(body, key)
        await pair.release_some(rng, p_release)
    await pair.drain()


ALL_LOW = {"hit", "low_match_tied", "low_match_untied"}


@pytest.mark.parametrize("order", ["random", "round_robin"])
def test_smg_gsp_sequential(tmp_path, order):
    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})
        await gsp_traffic(pair, gsp(11, order), random.Random(1))
        pair.check(f"gsp_{order}", ALL_LOW)

    run(tmp_path, 3, NO_TRIM, body)


def test_smg_bursts_lowered_thresholds(tmp_path):
    cfg = {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5, "eviction_interval_secs": 0}
    args = ["--balance-abs-threshold", "4", "--balance-rel-threshold", "1.5", *NO_TRIM]

    async def body(d):
        pair = SmgPair(d, cfg)
        reqs = gsp(12, "random", n_groups=6, per_group=24)
        by_group: dict[int, list] = {}
        for q in reqs:
            by_group.setdefault(q.group_id, []).append(q)
        rng = random.Random(2)
        groups = sorted(by_group)
        for burst in range(14):
            g = by_group[groups[burst % len(groups)]]
            for _ in range(10):
                q = g[rng.randrange(len(g))]
                await pair.send({"text": q.text}, q.text)
            await pair.release_some(rng, 0.5)
        await pair.drain()
        pair.check("bursts_lowered_thresholds", ALL_LOW | {"spill"}, must_differ=["v0_3_2_rule"])

    run(tmp_path, 3, args, body)


def test_smg_defaults_with_190_in_flight(tmp_path):
    """Defaults (margin 64): nothing released, the hits pile up; the 2-sigma cap makes the spill
    gate fire long before load - mean > 64 would."""

    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})
        for q in gsp(13, "random", n_groups=2, per_group=95):
            await pair.send({"text": q.text}, q.text)
        assert sum(await d.real_loads()) == 190
        await pair.drain()
        pair.check("defaults_190_in_flight", {"hit", "spill", "low_match_tied"},
                   must_differ=["margin_without_sigma_cap", "sigma_cap_not_rounded_up", "v0_3_2_rule"])

    run(tmp_path, 3, NO_TRIM, body)


def test_smg_brand_new_prefixes_tied_and_untied(tmp_path):
    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})
        rng = random.Random(3)
        letters = "abcdefghijklmnopqrstuvwxyz"
        for i in range(120):
            text = "".join(rng.choice(letters) for _ in range(60))
            await pair.send({"text": text}, text)
            if i % 3 == 2:
                await pair.drain()  # all idle again: a tie
            else:
                await pair.release_some(rng, 0.3)
        await pair.drain()
        pair.check("brand_new_prefixes", {"low_match_tied", "low_match_untied"},
                   must_differ=["ties_load_processed_index"])

    run(tmp_path, 2, NO_TRIM, body)


def test_smg_threshold_edge_0300_0301(tmp_path):
    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})
        rng = random.Random(4)
        letters = "abcdefghij"
        edge = []
        for i in range(50):
            base = f"{i:04d}" + "".join(rng.choice(letters) for _ in range(996))
            await pair.send({"text": base}, base)
            for n in (300, 301):  # n of 1000 characters match: 0.300 is a miss, 0.301 a hit
                text = base[:n] + "".join(rng.choice("KLMNOPQRST") for _ in range(1000 - n))
                await pair.send({"text": text}, text)
                edge.append((n, pair.step.last_branch))
            await pair.drain()
        assert all((b == "hit") == (n == 301) for n, b in edge), edge
        pair.check("threshold_edge", ALL_LOW)

    run(tmp_path, 2, NO_TRIM, body)


def test_smg_multibyte_text(tmp_path):
    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})

        def to_body(q):
            t = q.text.translate(MULTIBYTE)
            return {"text": t}, t

        await gsp_traffic(pair, gsp(14, "random"), random.Random(5), to_body=to_body)
        pair.check("multibyte_text", ALL_LOW)

    run(tmp_path, 3, NO_TRIM, body)


def test_smg_input_ids_only(tmp_path):
    async def body(d):
        pair = SmgPair(d, {"eviction_interval_secs": 0})

        def to_body(q):
            ids = [int(t) for t in q.prompt_tokens]
            return {"input_ids": ids}, ids_key(ids)

        await gsp_traffic(pair, gsp(15, "random"), random.Random(6), to_body=to_body)
        pair.check("input_ids_only", ALL_LOW)

    run(tmp_path, 3, NO_TRIM, body)


def test_smg_trim_one_budget_for_the_tree(tmp_path):
    """Trims every 2 s at a lowered max_tree_size, now one budget for both workers: families of
    prefixes reused with a skew, a lowered spill margin so families spread over both workers.
    Variants: no trimming and a per-worker budget must each disagree with the binary somewhere."""
    interval, max_size = 2, 1800
    cfg = {"eviction_interval_secs": interval, "max_tree_size": max_size, "balance_abs_threshold": 1,
           "balance_rel_threshold": 1.0}
    args = ["--eviction-interval-secs", str(interval), "--max-tree-size", str(max_size),
            "--balance-abs-threshold", "1", "--balance-rel-threshold", "1.0"]

    async def body(d):
        pair = SmgPair(d, cfg, variants=("per_worker_tree_budget", "v0_3_2_rule"))
        no_trim = CacheAwareRouter(match_on="text", worker_order="index",
                                   **{**cfg, "generation": BINARY, "eviction_interval_secs": 0})
        no_trim.reset(make_views(d.workers.n), seed=0)
        no_trim.tree.epoch = d.router.init_epochs()
        rng = random.Random(7)
        letters = "abcdefghijklmnop"
        families = [f"{f:02d}" + "".join(rng.choice(letters) for _ in range(rng.randint(80, 160))) for f in range(14)]
        weights = [1.0 / (1 + f) for f in range(len(families))]
        phases, phase_size, longest, no_trim_differs = 12, 12, 0.0, 0
        for phase in range(phases):
            count = await wait_trim(d, interval)
            t0 = time.monotonic()
            for _ in range(phase_size):
                fam = rng.choices(families, weights)[0]
                text = fam + "".join(rng.choice(letters) for _ in range(rng.randint(5, 40)))
                no_trim.loads = await d.real_loads()
                await pair.send({"text": text}, text, now_s=phase * interval)
                real = list(d.in_flight.values())[-1]
                no_trim.pick_tie = lambda ties: real if real in ties else ties[0]
                no_trim_differs += no_trim.decide(text, 0.0) != real
                no_trim.commit(text, real)
                await pair.release_some(rng, 0.5)
            await pair.drain()
            longest = max(longest, time.monotonic() - t0)
            assert d.router.evictions() == count, "a real trim ran in the middle of a phase: make phases shorter"
        assert pair.step.evictions_run >= phases - 2
        pair.differs["no_trim"] = no_trim_differs
        REPORT.append(f"smg trim: longest phase {longest:.2f} s of the {interval} s between trims")
        pair.branches["after_trim_changed"] = no_trim_differs
        pair.check("trim_one_tree_budget", ALL_LOW | {"after_trim_changed"},
                   must_differ=["per_worker_tree_budget", "no_trim"])

    run(tmp_path, 2, args, body)


def teardown_module(module):
    print("\n".join(["", "smg 1.13.0 agreement:", *REPORT]))
