"""Our routers against the real sglang-router 0.3.2 binary (make router-env), decision by decision.

Cache-aware scenarios must agree 100 % both step by step (our router given the real loads
before each decision, then the real decision) and in closed loop (our router alone), and
each asserts the branches it is meant to exercise. Round-robin agrees decision by decision;
random and power-of-two can only be compared statistically (the real ones draw from a thread
RNG; see docs/ALGORITHMS.md §3). Run: `make test-router-binary` (pytest -m router_binary).
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import numpy as np
import pytest
from omegaconf import OmegaConf

from repro.routing import CacheAwareRouter, PowerOfTwoRouter, RandomRouter, RoundRobinRouter
from repro.routing.approx_tree import ApproximateTree
from repro.routing.cache_aware import ids_key
from repro.workloads import build_workload
from tests.router_binary.binary_harness import REPO, Driver, HoldingWorkers, RealRouter, router_python
from tests.routing.cache_aware_reference import RefTree
from tests.routing.fakes import make_request, make_views

pytestmark = [pytest.mark.router_binary, pytest.mark.timeout(600)]

PY = None


@pytest.fixture(autouse=True)
def _router_venv():
    """A skip in set-up (not at collection), so that under CI=true tests/conftest.py fails it."""
    global PY
    PY = PY or router_python()
    if PY is None:
        pytest.skip("sglang-router 0.3.2 venv missing: run `make router-env`")

# The real router refuses an interval of 0; an hour never comes within a test (ours: 0 = never).
NO_TRIM = ["--eviction-interval-secs", "3600"]
REPORT: list[str] = []  # agreement lines, printed at the end of the module (pytest -s / -rA)


def gsp(seed: int, order: str = "random", n_groups: int = 8, per_group: int = 16, sys_len=(100, 300), q_len=30):
    cfg = OmegaConf.load(REPO / "conf" / "workload" / "gsp.yaml")
    cfg.num_queries = n_groups * per_group
    cfg.num_groups, cfg.prompts_per_group, cfg.order = n_groups, per_group, order
    cfg.system_prompt_len_range, cfg.question_len = list(sys_len), q_len
    return build_workload(cfg, seed, use_cache=False).requests


async def with_router(tmp_path, m: int, policy: str, args: list[str], body, python=None, binary="0.3.2"):
    workers = HoldingWorkers(m)
    await workers.start()
    router = RealRouter(python or PY, workers.urls, policy, args, tmp_path / f"router-{policy}.log", binary)
    try:
        router.start()
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            await router.wait_ready(session, m)
            return await body(Driver(workers, router, session))
    finally:
        for ev in workers.holds.values():
            ev.set()
        router.stop()
        await workers.stop()


class NoRestampTree(ApproximateTree):
    """Variant: a match never re-stamps."""

    def prefix_match(self, key):
        matched, node = self.walk(key)
        tenant = self._node_tenant(node)
        self._next_epoch()
        return matched, tenant


class RestampAlwaysTree(ApproximateTree):
    """Variant: every match re-stamps."""

    def prefix_match(self, key):
        matched, node = self.walk(key)
        tenant = self._node_tenant(node)
        e = self._next_epoch()
        if tenant is not None:
            node.tenants[tenant] = e
        return matched, tenant


# Rules the real router must be seen to reject where a scenario claims to exercise the tree's stamps.
# (Stamping an insert's whole path instead of its last node gives the same trim order: a parent
# becomes a leaf only when its last child is popped, whose stamp is >= the parent's either way.)
TREE_VARIANTS = {
    "no_restamp": (NoRestampTree, True),
    "restamp_every_match": (RestampAlwaysTree, True),
    "epoch_ignores_startup": (ApproximateTree, False),
}


class CacheAwarePair:
    """`step` and `closed` copies of our router, set up in the real router's order and epoch,
    plus step-style `variants` (real loads in, real decision committed) that count how often a
    different rule would have decided otherwise."""

    def __init__(self, driver: Driver, order: list[int], cfg: dict, variants: dict | None = None):
        self.driver = driver
        m = driver.workers.n

        def make(tree_cls=ApproximateTree, startup_epochs=True, **extra):
            r = CacheAwareRouter(match_on="text", worker_order=order, **{**cfg, **extra})
            r.reset(make_views(m), seed=0)
            r.tree.__class__ = tree_cls
            if startup_epochs:
                r.tree.epoch = driver.router.init_epochs()  # start-up's empty-key inserts
            return r

        self.step, self.closed = make(), make()
        self.variants = {name: make(**kw) for name, kw in (variants or {}).items()}
        self.differs = {name: 0 for name in self.variants}

    async def send(self, body: dict, key: str, now_s: float = 0.0) -> None:
        picks = {}
        if self.variants:
            loads = await self.driver.real_loads()
            for name, r in self.variants.items():
                r.loads = list(loads)
                picks[name] = r.decide(key, now_s)
        await self.driver.cache_aware_step(body, key, self.step, self.closed, now_s)
        real = list(self.driver.in_flight.values())[-1]
        for name, r in self.variants.items():
            self.differs[name] += picks[name] != real
            r.commit(key, real)

    async def release_some(self, rng: random.Random, p: float) -> None:
        await self.driver.release([r for r in list(self.driver.in_flight) if rng.random() < p], self.closed)

    async def drain(self) -> None:
        await self.driver.drain(self.closed)


def check(name: str, driver: Driver, pair: CacheAwarePair, branches: set[str]) -> None:
    t = driver.tally
    REPORT.append(t.line(name))
    print(t.line(name))
    assert t.decisions >= 100
    assert t.step_agree == t.decisions and t.closed_agree == t.decisions, (
        f"{t.line(name)}; first disagreements (k, branch, real, step, closed, key): {t.disagreements[:5]}")
    missing = branches - set(t.branches)
    assert not missing, f"{name}: branches never taken: {missing} ({t.branches})"
    assert pair.step.tree.hash_order_choices == 0, "a decision depended on the real router's per-node hash order"


async def gsp_traffic(pair: CacheAwarePair, requests, rng: random.Random, p_release=0.3, to_body=None) -> None:
    for q in requests:
        body, key = to_body(q) if to_body else ({"text": q.text}, q.text)
        await pair.send(body, key)
        await pair.release_some(rng, p_release)
    await pair.drain()


ALL_LOW = {"hit", "low_match_tied", "low_match_untied"}


@pytest.mark.parametrize("order", ["random", "round_robin"])
def test_gsp_sequential(tmp_path, order):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})
        await gsp_traffic(pair, gsp(11, order), random.Random(1))
        check(f"gsp_{order}", d, pair, ALL_LOW)

    asyncio.run(with_router(tmp_path, 3, "cache_aware", NO_TRIM, body))


def test_bursts_lowered_thresholds(tmp_path):
    cfg = {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5, "eviction_interval_secs": 0}
    args = ["--balance-abs-threshold", "4", "--balance-rel-threshold", "1.5", *NO_TRIM]

    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), cfg)
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
        check("bursts_lowered_thresholds", d, pair, ALL_LOW | {"imbalanced"})

    asyncio.run(with_router(tmp_path, 3, "cache_aware", args, body))


def test_defaults_with_180_in_flight(tmp_path):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})
        reqs = gsp(13, "random", n_groups=2, per_group=95)
        for q in reqs:  # nothing released: the hits pile up until the imbalance test fires
            await pair.send({"text": q.text}, q.text)
        assert sum(await d.real_loads()) == 190
        await pair.drain()
        check("defaults_190_in_flight", d, pair, {"hit", "imbalanced", "low_match_tied"})

    asyncio.run(with_router(tmp_path, 3, "cache_aware", NO_TRIM, body))


def test_brand_new_prefixes_tied_and_untied(tmp_path):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})
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
        check("brand_new_prefixes", d, pair, {"low_match_tied", "low_match_untied"})

    asyncio.run(with_router(tmp_path, 2, "cache_aware", NO_TRIM, body))


def test_threshold_edge_0300_0301(tmp_path):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})
        rng = random.Random(4)
        letters = "abcdefghij"
        edge_branches = []
        for i in range(50):
            base = f"{i:04d}" + "".join(rng.choice(letters) for _ in range(996))
            await pair.send({"text": base}, base)
            for n in (300, 301):  # n of 1000 characters match: 0.300 is a miss, 0.301 a hit
                tail = "".join(rng.choice("KLMNOPQRST") for _ in range(1000 - n))
                text = base[:n] + tail
                await pair.send({"text": text}, text)
                edge_branches.append((n, pair.step.last_branch))
            await pair.drain()
        assert all((b == "hit") == (n == 301) for n, b in edge_branches), edge_branches
        check("threshold_edge", d, pair, ALL_LOW)

    asyncio.run(with_router(tmp_path, 2, "cache_aware", NO_TRIM, body))


MULTIBYTE = str.maketrans({"a": "é", "e": "中", "o": "🙂", "i": "ß", "u": "ü"})


def test_multibyte_text(tmp_path):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})

        def to_body(q):
            t = q.text.translate(MULTIBYTE)
            return {"text": t}, t

        await gsp_traffic(pair, gsp(14, "random"), random.Random(5), to_body=to_body)
        check("multibyte_text", d, pair, ALL_LOW)

    asyncio.run(with_router(tmp_path, 3, "cache_aware", NO_TRIM, body))


def test_input_ids_only(tmp_path):
    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), {"eviction_interval_secs": 0})

        def to_body(q):
            ids = [int(t) for t in q.prompt_tokens]
            return {"input_ids": ids}, ids_key(ids)

        await gsp_traffic(pair, gsp(15, "random"), random.Random(6), to_body=to_body)
        check("input_ids_only", d, pair, ALL_LOW)

    asyncio.run(with_router(tmp_path, 3, "cache_aware", NO_TRIM, body))


def test_trimming_changes_later_decisions(tmp_path):
    """Trims every 2 s at a lowered max_tree_size; families of prefixes reused with a skew, a
    lowered imbalance threshold so families spread over both workers (shared nodes, joined at
    stamp 0). Variant: no trimming, which must disagree with the real router somewhere."""
    interval, max_size = 2, 900
    cfg = {"eviction_interval_secs": interval, "max_tree_size": max_size, "balance_abs_threshold": 2}
    args = ["--eviction-interval-secs", str(interval), "--max-tree-size", str(max_size),
            "--balance-abs-threshold", "2"]
    variants = {"no_trim": {"eviction_interval_secs": 0}}

    async def body(d: Driver):
        order = await d.registry_order()
        pair = CacheAwarePair(d, order, cfg, variants)
        ref = RefTree(order)  # eviction ambiguity detector (equal stamps: heap order decides)
        for w in order:
            ref.insert("", w)
        ref.epoch = d.router.init_epochs()
        ambiguous = 0
        rng = random.Random(7)
        letters = "abcdefghijklmnop"
        families = [f"{f:02d}" + "".join(rng.choice(letters) for _ in range(rng.randint(80, 160))) for f in range(14)]
        weights = [1.0 / (1 + f) for f in range(len(families))]
        phase_size, phases = 12, 12
        longest = 0.0
        for phase in range(phases):
            # Wait for the real background trim that follows the previous phase, then route the
            # phase before the next one (`interval` s later); our routers trim at now = phase * interval.
            if phase:
                ambiguous += ref.evict(max_size)
            seen = d.router.evictions()
            for _ in range(int(3 * interval / 0.02)):
                if d.router.evictions() > seen:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the real router's trim never ran")
            count = d.router.evictions()
            t0 = time.monotonic()
            for _ in range(phase_size):
                fam = rng.choices(families, weights)[0]
                text = fam + "".join(rng.choice(letters) for _ in range(rng.randint(5, 40)))
                await pair.send({"text": text}, text, now_s=phase * interval)
                if pair.step.last_branch != "imbalanced":
                    ref.match(text)
                ref.insert(text, list(d.in_flight.values())[-1])
                await pair.release_some(rng, 0.5)
            await pair.drain()
            longest = max(longest, time.monotonic() - t0)
            assert d.router.evictions() == count, "a real trim ran in the middle of a phase: make phases shorter"
        assert not ambiguous, "a trim met equal stamps (the real heap's order is unknowable): change the traffic"
        assert pair.step.evictions_run >= phases - 2
        REPORT.append(f"trim variants, decisions that would differ from the real router: {pair.differs}; "
                      f"longest phase {longest:.2f} s of the {interval} s between trims")
        print(REPORT[-1])
        d.tally.branches["after_trim_changed"] = pair.differs["no_trim"]
        check("trim_max_tree_size", d, pair, ALL_LOW | {"imbalanced", "after_trim_changed"})

    asyncio.run(with_router(tmp_path, 2, "cache_aware", args, body))


async def wait_trim(d: Driver, interval: float) -> int:
    """Block until the real router's background trim has run once more; returns the new count."""
    seen = d.router.evictions()
    for _ in range(int(3 * interval / 0.02)):
        if d.router.evictions() > seen:
            return d.router.evictions()
        await asyncio.sleep(0.02)
    raise AssertionError("the real router's trim never ran")


def test_trim_order_follows_the_real_stamps(tmp_path):
    """Which parts of a worker's tree survive a trim, read back through hit-or-miss probes.

    Per round, on worker A (= first in registry order: all idle, a tie): 12 new keys K_j of 100
    characters, then 12 queries K_j[:60] + 40 new characters (a miss at cache_threshold 0.7, still
    a match that stops inside K_j: re-stamped one time in eight, then split). The trim to 1360
    characters removes the oldest 8 of the 12 tails K_j[60:]. Probes K_j with A kept busy: tail
    kept -> 100 % -> A; tail gone -> 60 % -> the idle worker. The stamp rules the real tree does
    not follow must each disagree with the real router somewhere."""
    interval, max_size, n_keys = 2, 1360, 12
    cfg = {"eviction_interval_secs": interval, "max_tree_size": max_size, "cache_threshold": 0.7,
           "balance_abs_threshold": 2}
    args = ["--eviction-interval-secs", str(interval), "--max-tree-size", str(max_size), "--cache-threshold", "0.7",
            "--balance-abs-threshold", "2"]
    variants = {name: {"tree_cls": cls, "startup_epochs": startup} for name, (cls, startup) in TREE_VARIANTS.items()}

    async def body(d: Driver):
        pair = CacheAwarePair(d, await d.registry_order(), cfg, variants)
        rng = random.Random(8)
        letters = "abcdefghij"
        segment, longest = 0, 0.0
        for rnd in range(4):
            keys = [chr(0x4E00 + 64 * rnd + j) + "".join(rng.choice(letters) for _ in range(99)) for j in range(n_keys)]
            count = await wait_trim(d, interval)
            t0 = time.monotonic()
            for k in keys:
                await pair.send({"text": k}, k, now_s=segment * interval)
                await pair.drain()
            # A balanced decision draws 2 epochs (match, insert): if the touches' matches would all
            # fall on odd epochs (never re-stamping), one imbalanced decision (1 epoch: no match)
            # shifts them. Our step router's epoch is the real one (the agreement checks it).
            if pair.step.tree.epoch % 2:
                x = chr(0xA000 + rnd) + "x" * 99
                for _ in range(3):  # three hits on A, held: loads 3 vs 0 > balance_abs_threshold
                    await pair.send({"text": x}, x, now_s=segment * interval)
                y = chr(0xA100 + rnd) + "y" * 99
                await pair.send({"text": y}, y, now_s=segment * interval)
                assert pair.step.last_branch == "imbalanced"
                await pair.drain()
            # Oldest first, 2 epochs per touch: 2 of the 8 oldest tails are re-stamped.
            for j in range(n_keys):
                q = keys[j][:60] + "".join(rng.choice("KLMNOPQRST") for _ in range(40))
                await pair.send({"text": q}, q, now_s=segment * interval)
                await pair.drain()
            longest = max(longest, time.monotonic() - t0)
            assert d.router.evictions() == count, "a real trim ran in the middle of a segment"
            segment += 1
            count = await wait_trim(d, interval)
            t0 = time.monotonic()
            busy = chr(0x9000 + rnd) + "".join(rng.choice(letters) for _ in range(99))
            await pair.send({"text": busy}, busy, now_s=segment * interval)  # held: A is the busier one
            busy_rid = list(d.in_flight)[-1]
            for k in keys:
                await pair.send({"text": k}, k, now_s=segment * interval)
                await d.release([list(d.in_flight)[-1]], pair.closed)
            await d.release([busy_rid], pair.closed)
            longest = max(longest, time.monotonic() - t0)
            assert d.router.evictions() == count, "a real trim ran in the middle of a segment"
            segment += 1
        REPORT.append(f"trim stamp variants, decisions that would differ from the real router: {pair.differs}; "
                      f"longest segment {longest:.2f} s of the {interval} s between trims")
        print(REPORT[-1])
        check("trim_stamp_order", d, pair, {"hit", "low_match_tied", "low_match_untied"})
        assert pair.step.tree.epoch > 0
        must_differ = dict(pair.differs)
        if (d.router.init_epochs() - d.workers.n) % 8 == 0:  # then the start-up epochs shift no re-stamp
            must_differ.pop("epoch_ignores_startup")
        assert all(n > 0 for n in must_differ.values()), f"a stamp rule made no difference here: {pair.differs}"

    asyncio.run(with_router(tmp_path, 2, "cache_aware", args, body))


def test_round_robin_decision_by_decision(tmp_path):
    async def body(d: Driver):
        order = await d.registry_order()
        ours = RoundRobinRouter()
        views = make_views(d.workers.n)
        ours.reset(views, seed=0)
        agree = 0
        for i in range(120):
            mine = order[ours.select_worker(make_request(i, [1]), views, 0.0)]
            real = await d.send({"text": f"hello {i}"})
            agree += mine == real
            await d.drain()
        REPORT.append(f"round_robin: {agree}/120 decisions agree")
        assert agree == 120

    asyncio.run(with_router(tmp_path, 3, "round_robin", [], body))


def chi2_uniform(counts) -> float:
    counts = np.asarray(counts, dtype=float)
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


CHI2_DF3 = 30.66  # chi-square critical value, 3 degrees of freedom, p = 1e-6: a run fails by chance ~never


def test_random_choice_distribution(tmp_path):
    n, m = 400, 4

    async def body(d: Driver):
        real = [0] * m
        for i in range(n):
            real[await d.send({"text": f"r{i}"})] += 1
            await d.drain()
        ours = RandomRouter()
        views = make_views(m)
        ours.reset(views, seed=0)
        mine = [0] * m
        for i in range(n):
            mine[ours.select_worker(make_request(i, [1]), views, 0.0)] += 1
        REPORT.append(f"random: real counts {real} (chi2 {chi2_uniform(real):.1f}), ours {mine} "
                      f"(chi2 {chi2_uniform(mine):.1f}); both uniform at p=1e-6 if < {CHI2_DF3}")
        assert chi2_uniform(real) < CHI2_DF3 and chi2_uniform(mine) < CHI2_DF3

    asyncio.run(with_router(tmp_path, m, "random", [], body))


def test_power_of_two_what_it_compares(tmp_path):
    """The real power_of_two compares loads polled from the workers when both candidates
    report one, else its request counters, which it never increments (only cache_aware and
    manual hold a load guard): in front of workers without a load endpoint every pick is the
    first drawn candidate, i.e. uniform, however many requests are held. Ours compares its own
    in-flight counts and keeps the held requests balanced."""
    n, m = 300, 4

    async def body(d: Driver):
        real = [0] * m
        for i in range(n):
            real[await d.send({"text": f"p{i}"})] += 1
        assert await d.real_loads() == [0] * m  # 300 held, and the router counts none of them
        await d.drain()
        ours = PowerOfTwoRouter()
        views = make_views(m)
        ours.reset(views, seed=0)
        for i in range(n):
            ours.select_worker(make_request(i, [1]), views, 0.0)  # nothing completes: all held
        mine = ours.in_flight
        REPORT.append(f"power_of_two (300 held): real {real} (chi2 {chi2_uniform(real):.1f}, spread "
                      f"{max(real) - min(real)}, router-side loads all 0), ours {mine} (spread {max(mine) - min(mine)})")
        assert chi2_uniform(real) < CHI2_DF3
        assert max(mine) - min(mine) <= 3  # ours balances what is held (seeded: the same every run)

    asyncio.run(with_router(tmp_path, m, "power_of_two", [], body))


def teardown_module(module):
    print("\n".join(["", "router-binary agreement:", *REPORT]))
