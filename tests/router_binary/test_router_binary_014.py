"""Our `generation: le_0_1_4` cache-aware rule against the real sglang-router 0.1.4 wheel (PyPI, the
router of sglang 0.4.6; `make router-env` builds .venv-router014), decision by decision, in the
scenario families of 0.3.2's parity tests (test_router_binary_parity.py).

What the wheel routes on: its request-text reader compares the route name without the leading
slash ("generate") with the one the server passes ("/generate"), so every request, whatever its
`text` or `input_ids`, routes on the empty string. Our rule with `match_on: none` is that rule;
the scenarios assert it (sizes stay 0 in the binary's own report, text routing would disagree).
With an empty key a decision is the imbalance test (least loaded, ties in the load map's hash
order) or a low match (0/0 is NaN: never a hit), which goes to the smallest tree, ties in the size
map's hash order. Both orders are random per process; the binary prints both maps in their order
with every background trim (info level, every --eviction-interval s), and the test reads them
there: reproduced, and checked against the next reports. The per-node hash order that picks a
hit's tenant is unobservable in the wheel's decisions (no hit can happen): a variant with every
node's order reversed must agree with the real router at every decision.

Step by step: our router given the real loads before each decision (the binary counts a request
down before its reply leaves, so the requests our client has not seen answered are its loads;
checked against its own report at the end of every scenario), then the real decision committed.
Closed loop: our router alone. Both must agree 100 %, each scenario asserts the branches it is
meant to take, and rules the binary must be seen to reject must each decide otherwise somewhere.
Run: `make test-router-binary` (pytest -m router_binary).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path
from dataclasses import dataclass

import pytest

from repro.routing import CacheAwareRouter
from tests.router_binary.binary_harness import STEP_TIMEOUT_S, Driver, router_python
from tests.router_binary.test_router_binary_parity import MULTIBYTE, gsp, with_router
from tests.routing.fakes import make_views

pytestmark = [pytest.mark.router_binary, pytest.mark.timeout(600)]

BINARY = "0.1.4"
PY = None
REPORT: list[str] = []
# 0.1.4's defaults (its launcher's and conf/router/cache_aware_014.yaml's); its trim runs every
# second so that it reports its maps (the tree stays empty: the trim never removes anything)
DEFAULTS = {"cache_threshold": 0.5, "balance_abs_threshold": 32, "balance_rel_threshold": 1.0001}
REPORT_EVERY = ["--eviction-interval", "1"]


@pytest.fixture(autouse=True)
def _router014_venv():
    """A skip in set-up (not at collection), so that under CI=true tests/conftest.py fails it."""
    global PY
    PY = PY or router_python(BINARY)
    if PY is None:
        pytest.skip("sglang-router 0.1.4 venv missing: run `make router-env`")


@dataclass
class MapReport:
    """One background-trim report: the size map and the load map, each in its hash order."""

    size_order: list[int]
    sizes: list[int]
    load_order: list[int]
    loads: list[int]
    processed: list[int]


_TENANT = re.compile(r"Tenant: (\S+), Size: (\d+)")
_ENTRY = re.compile(r'"([^"]+)": (\d+)')


def map_reports(log: str, url_to_id: dict[str, int]) -> list[MapReport]:
    reports, sizes, processed = [], None, None
    for line in log.splitlines():
        if "Before eviction - Used size per tenant:" in line:
            sizes = []
        elif "After eviction" in line:
            sizes_done, sizes = sizes, None
        elif sizes is not None and (m := _TENANT.search(line)):
            sizes.append((url_to_id[m.group(1)], int(m.group(2))))
        elif "Processed Queue: {" in line:
            processed = dict(_ENTRY.findall(line.split("Processed Queue: ", 1)[1]))
        elif "Running Queue: {" in line and processed is not None:
            entries = [(url_to_id[u], int(n)) for u, n in _ENTRY.findall(line.split("Running Queue: ", 1)[1])]
            n = len(url_to_id)
            loads, done = [0] * n, [0] * n
            for w, c in entries:
                loads[w] = c
            for u, c in processed.items():
                done[url_to_id[u]] = int(c)
            by_id = dict(sizes_done)
            reports.append(
                MapReport(
                    [w for w, _ in sizes_done], [by_id[w] for w in range(n)], [w for w, _ in entries], loads, done
                )
            )
            processed = None
    return reports


async def next_report(d: Driver, after: int) -> MapReport:
    """Wait for the binary's next report (the (after+1)-th of the run)."""
    deadline = time.monotonic() + 3 + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        reports = map_reports(d.router.log(), d.url_to_id)
        if len(reports) > after:
            return reports[after]
        await asyncio.sleep(0.05)
    raise AssertionError("the real router printed no trim report")


class ReversedHashOrder(CacheAwareRouter):
    """Variant: every node's hash order reversed (the tenant a hit would take)."""

    def reset(self, workers, seed):
        super().reset(workers, seed)
        tree = self.tree
        default = tree.first_tenant
        tree.first_tenant = lambda node: (
            max(node.tenants, key=lambda t: (t != default(node), t)) if node.tenants else None
        )


VARIANTS = {
    # the rule of sglang-router 0.3.2: a low match goes to the least-loaded worker
    "v0_3_2_rule": (CacheAwareRouter, {"generation": "v0_3_2"}),
    # the other routing key: the request text for the 0.1.4 wheel (the authors' build), "" for 0.1.5
    "other_routing_key": (CacheAwareRouter, {}),
    # one hash order for both maps (which one is used where)
    "sizes_in_load_order": (CacheAwareRouter, {}),
    "loads_in_size_order": (CacheAwareRouter, {}),
    # 0.1.4: must never differ (without a hit the per-node order is not observable); 0.1.5: must
    "reversed_hash_order": (ReversedHashOrder, {}),
}


class Pair014:
    """`step` and `closed` copies of our 0.1.4 rule with the binary's two map orders, plus variants.

    match_on "none" (the 0.1.4 wheel) or "text" (0.1.5). Where a hit's node holds several tenants,
    the binary's per-node hash order picked one: our routers (not the reversed variant) continue
    with the real pick, which must be one of them and the same each time that node (or a split
    copy of it, same order) is met with the same tenants."""

    def __init__(self, d: Driver, report: MapReport, cfg: dict, match_on: str = "none"):
        self.d = d
        self.report = report
        self.match_on = match_on
        m = d.workers.n
        self.picks: list[int] = []  # every real decision
        self.node_orders: dict = {}  # (node salt, its tenants) -> the binary's pick on a hit
        self.hash_order_hits = 0
        self._seen = None
        self._real = -1

        def make(cls=CacheAwareRouter, **extra):
            kw = {"match_on": match_on, "generation": "le_0_1_4", "eviction_interval_secs": 0, **DEFAULTS, **cfg}
            r = cls(worker_order=report.load_order, **{**kw, **extra})
            r.reset(make_views(m), seed=0)
            r.size_order = list(report.size_order)
            if cls is not ReversedHashOrder:
                r.tree.first_tenant = self._replay
            return r

        self.step, self.closed = make(), make()
        other = "text" if match_on == "none" else "none"
        self.variants = {name: make(cls, **kw) for name, (cls, kw) in VARIANTS.items() if name != "other_routing_key"}
        self.variants["other_routing_key"] = make(match_on=other)
        self.variants["sizes_in_load_order"].size_order = list(report.load_order)
        self.variants["loads_in_size_order"].order = list(report.size_order)
        self.differs = {name: 0 for name in self.variants}
        self.loads = [0] * m  # the requests our client has not seen answered, per real worker
        self.branches: dict[str, int] = {}
        self.decisions = self.step_agree = self.closed_agree = 0
        self.disagreements: list = []

    def _replay(self, node):
        tenants = node.tenants
        if len(tenants) < 2:
            return next(iter(tenants), None)
        self._seen = (node.salt, frozenset(tenants))
        return self._real if self._real in tenants else min(tenants)

    def key(self, name: str, text_key: str) -> str:
        text = self.match_on == "text"
        if name == "other_routing_key":
            text = not text
        return text_key if text else ""

    async def send(self, body: dict, text_key: str = "", now_s: float = 0.0) -> int:
        d, loads = self.d, list(self.loads)
        real = self._real = await d.send(body)
        self.loads[real] += 1
        self.picks.append(real)
        for name, r in self.variants.items():
            key = self.key(name, text_key)
            r.loads = list(loads)
            self.differs[name] += r.decide(key, now_s) != real
            r.commit(key, real)
        step, closed = self.step, self.closed
        key = self.key("step", text_key)
        step.loads = list(loads)
        self._seen = None
        s = step.decide(key, now_s)
        seen = self._seen
        step.commit(key, real)
        c = closed.route_key(key, now_s)
        if step.last_branch == "hit" and seen is not None:  # the binary's per-node order decided
            assert real in seen[1], f"the real pick {real} is none of the node's tenants {sorted(seen[1])}"
            assert self.node_orders.setdefault(seen, real) == real, (
                f"node {seen}: picks {self.node_orders[seen]}, {real}"
            )
            self.hash_order_hits += 1
        self.decisions += 1
        self.step_agree += s == real
        self.closed_agree += c == real
        self.branches[step.last_branch] = self.branches.get(step.last_branch, 0) + 1
        if s != real or c != real:
            self.disagreements.append((d.k - 1, step.last_branch, real, s, c))
        return real

    async def release(self, rids) -> None:
        rids = list(rids)
        workers = [self.d.in_flight[r] for r in rids]
        await self.d.release(rids)  # each reply: the binary has counted it down
        for w in workers:
            self.loads[w] -= 1
            self.closed.release(w)

    async def release_some(self, rng: random.Random, p: float) -> None:
        await self.release([r for r in list(self.d.in_flight) if rng.random() < p])

    async def check_report(self) -> MapReport:
        """The binary's next report: the same two orders, our sizes (0.1.4's: all 0), loads and counts."""
        rep = await next_report(self.d, len(map_reports(self.d.router.log(), self.d.url_to_id)))
        assert (rep.size_order, rep.load_order) == (self.report.size_order, self.report.load_order)
        sizes = [self.step.tree.tenant_size[w] for w in range(self.d.workers.n)]
        assert rep.sizes == sizes == [self.closed.tree.tenant_size[w] for w in range(self.d.workers.n)], (
            rep.sizes,
            sizes,
        )
        if self.match_on == "none":
            assert rep.sizes == [0] * len(rep.sizes), f"the wheel's tree grew: {rep.sizes}"
        assert rep.loads == self.loads == self.closed.loads, (rep.loads, self.loads, self.closed.loads)
        assert rep.processed == [self.picks.count(w) for w in range(self.d.workers.n)]
        return rep


def finish(name: str, pair: Pair014, branches: set[str], must_differ=("v0_3_2_rule", "other_routing_key")) -> None:
    line = (
        f"{name}: {pair.decisions} decisions, step-by-step {pair.step_agree}/{pair.decisions}, closed-loop "
        f"{pair.closed_agree}/{pair.decisions}, branches {dict(sorted(pair.branches.items()))}, "
        f"variants differing {pair.differs}, hits decided by a node's hash order {pair.hash_order_hits}"
    )
    REPORT.append(line)
    print(line)
    assert pair.decisions >= 100
    assert pair.step_agree == pair.decisions and pair.closed_agree == pair.decisions, (
        f"{line}; first disagreements (k, branch, real, step, closed): {pair.disagreements[:5]}"
    )
    assert set(pair.branches) == branches, f"{name}: branches {pair.branches}, meant {branches}"
    if pair.match_on == "none":
        assert pair.differs["reversed_hash_order"] == 0 and pair.hash_order_hits == 0
    for name_ in must_differ:
        assert pair.differs[name_] > 0, f"{name}: {name_} decided like the real router everywhere: {pair.differs}"
    rep = pair.report
    if rep.size_order[0] != rep.load_order[0]:
        assert pair.differs["sizes_in_load_order"] > 0


def rest_differ(rep: MapReport) -> bool:
    """Whether the two orders rank the workers other than the one every low match fills differently
    (then an imbalanced decision among them tells which order the binary uses)."""
    first = rep.size_order[0]
    return [w for w in rep.load_order if w != first] != [w for w in rep.size_order if w != first]


async def start(d: Driver, cfg: dict | None = None, match_on: str = "none") -> Pair014:
    return Pair014(d, await next_report(d, 0), cfg or {}, match_on)


async def traffic(pair: Pair014, requests, rng: random.Random, p_release=0.3, to_body=None) -> None:
    for q in requests:
        body, key = to_body(q) if to_body else ({"text": q.text}, q.text)
        await pair.send(body, key)
        await pair.release_some(rng, p_release)


def run(tmp_path, m, args, body, binary=BINARY):
    py = PY if binary == BINARY else router_python(binary)
    asyncio.run(with_router(tmp_path, m, "cache_aware", [*REPORT_EVERY, *args], body, python=py, binary=binary))


@pytest.mark.parametrize("order", ["random", "round_robin"])
def test_gsp_sequential(tmp_path, order):
    async def body(d: Driver):
        pair = await start(d)
        await traffic(pair, gsp(11, order), random.Random(1))
        await pair.check_report()
        await pair.release(list(d.in_flight))
        await pair.check_report()
        finish(f"gsp_{order}", pair, {"low_match_tied"})

    run(tmp_path, 3, [], body)


def test_bursts_lowered_thresholds(tmp_path):
    cfg = {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5}

    async def body(d: Driver):
        pair = await start(d, cfg)
        reqs = gsp(12, "random", n_groups=6, per_group=24)
        rng = random.Random(2)
        for burst in range(14):
            for _ in range(10):
                q = reqs[rng.randrange(len(reqs))]
                await pair.send({"text": q.text}, q.text)
            await pair.release_some(rng, 0.5)
            if burst % 5 == 4:
                await pair.check_report()
        await pair.release(list(d.in_flight))
        await pair.check_report()
        finish("bursts_lowered_thresholds", pair, {"low_match_tied", "imbalanced"})
        assert pair.differs["loads_in_size_order"] > 0 or not rest_differ(pair.report)

    run(tmp_path, 3, ["--balance-abs-threshold", "4", "--balance-rel-threshold", "1.5"], body)


def test_defaults_with_190_in_flight(tmp_path):
    """Nothing released: one worker takes every low match until it holds 33 more than the least
    loaded, then the imbalance test spreads the rest, its load ties in the load map's order."""

    async def body(d: Driver):
        pair = await start(d)
        for q in gsp(13, "random", n_groups=2, per_group=95):
            await pair.send({"text": q.text}, q.text)
        rep = await pair.check_report()
        assert sum(rep.loads) == 190 and max(rep.loads) - min(rep.loads) <= 33
        await pair.release(list(d.in_flight))
        await pair.check_report()
        finish("defaults_190_in_flight", pair, {"low_match_tied", "imbalanced"})
        assert pair.differs["loads_in_size_order"] > 0 or not rest_differ(pair.report)

    run(tmp_path, 3, [], body)


def test_multibyte_text_and_input_ids(tmp_path):
    async def body(d: Driver):
        pair = await start(d, {"balance_abs_threshold": 3})
        rng = random.Random(5)
        for i, q in enumerate(gsp(14, "random")):
            if i % 2:
                t = q.text.translate(MULTIBYTE)
                await pair.send({"text": t}, t)
            else:  # ids only: routed on "" by the authors' build too
                await pair.send({"input_ids": [int(x) for x in q.prompt_tokens]}, "")
            await pair.release_some(rng, 0.2)
        await pair.release(list(d.in_flight))
        await pair.check_report()
        finish("multibyte_text_and_input_ids", pair, {"low_match_tied", "imbalanced"})

    run(tmp_path, 3, ["--balance-abs-threshold", "3"], body)


def test_threshold_and_repeats_never_hit(tmp_path):
    """The 0.3.2 threshold-edge family: the same text twice, and 0.2-0.9 of it shared, at
    cache threshold 0 - a router reading the text would hit every time; the wheel never does."""

    async def body(d: Driver):
        pair = await start(d, {"cache_threshold": 0.0, "balance_abs_threshold": 1})
        rng = random.Random(4)
        for i in range(40):
            base = f"{i:04d}" + "".join(rng.choice("abcdefghij") for _ in range(296))
            for text in (base, base, base[: rng.randint(60, 270)] + "KLMNOP"):
                await pair.send({"text": text}, text)
            await pair.release_some(rng, 0.6)
        await pair.release(list(d.in_flight))
        await pair.check_report()
        finish("threshold_and_repeats", pair, {"low_match_tied", "imbalanced"})

    run(tmp_path, 2, ["--cache-threshold", "0", "--balance-abs-threshold", "1"], body)


def teardown_module(module):
    print("\n".join(["", "router-binary agreement (sglang-router 0.1.4):", *REPORT]))


# ------------------------------------------------------------------------------- the live path
def cell_cfg_014(m: int = 2, **router) -> dict:
    from tests.live.live_helpers import hardware_cfg, load_yaml, model_cfg

    return {
        "seed": 0,
        "model": model_cfg(),
        "hardware": hardware_cfg(),
        "cluster": {
            "num_workers": m,
            "mem_fraction": 0.9,
            "kv_cache_tokens": None,
            "scheduler": {
                "schedule_policy": "lpm",
                "max_running_requests": 256,
                "max_prefill_tokens": 16384,
                "chunked_prefill_size": 8192,
            },
        },
        "router": {**load_yaml("router/cache_aware_014.yaml"), "match_on": "none", **router},
        "eviction": {"name": "lru", "granularity": "node"},
        "backend": {
            "name": "sglang",
            "emulate": True,
            "time_scale": 20.0,
            "router_impl": "sglang_router",
            "sglang_router": {"python_014": str(PY), "extra_args": []},
            "timeouts": {
                "server_start_s": 60,
                "router_start_s": 60,
                "request_s": 30,
                "cell_s": 300,
                "shutdown_grace_s": 5,
            },
        },
    }


def test_live_plan_launches_the_014_wheel_with_its_flags(tmp_path):
    """backend=sglang router_impl=sglang_router with generation le_0_1_4: the 0.1.4 venv's
    interpreter, 0.1.4's flags (parsed by the wheel's own launcher), /health as readiness; a
    routing key the wheel does not route on is refused before anything starts."""
    import subprocess

    from repro.backends.assembly import SeedPlan
    from repro.backends.sglang import backend, orchestrate
    from repro.backends.sglang.errors import OrchestrationError
    from tests.live.live_helpers import need_parts

    need_parts()
    m = 2
    cfg = cell_cfg_014(m)
    assert backend.validate_cell(cfg) == []
    plan = orchestrate.plan_cell(cfg, [200_000] * m, SeedPlan.spawn(0, m), tmp_path / "logs")
    cmd = plan.router.cmd
    assert cmd[:3] == [str(PY), "-m", "sglang_router.launch_router"] and plan.router.health_url.endswith("/health")
    code = (
        "import sys\nfrom sglang_router.launch_router import parse_router_args\n"
        "a = parse_router_args(sys.argv[1:])\n"
        "print(a.policy, a.cache_threshold, a.balance_abs_threshold, a.balance_rel_threshold, "
        "a.eviction_interval, a.max_tree_size, len(a.worker_urls))\n"
    )
    out = subprocess.run([str(PY), "-c", code, *cmd[3:]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cache_aware", "0.5", "32", "1.0001", "60", str(2**24), str(m)]
    for bad, fragment in (({"match_on": "auto"}, "match_on"), ({"eviction_interval_secs": 0}, "whole number")):
        assert any(fragment in e for e in backend.validate_cell(cell_cfg_014(m, **bad)))
    with pytest.raises(OrchestrationError, match="match_on=none"):
        orchestrate.sglang_router_command(
            str(PY),
            "h",
            1,
            ["http://h:2"],
            cell_cfg_014(m, match_on="text")["router"],
            request_timeout_s=1,
            worker_startup_timeout_s=1,
            prometheus_port=3,
        )


def test_emulated_cell_through_the_014_wheel(tmp_path):
    """A whole cell through run_plan with the real 0.1.4 router in front of emulated workers:
    every request served; with no imbalance (at most 32 in flight apart) every one goes to one
    worker, the first of the binary's size map, as le_0_1_4 with match_on none decides."""
    from repro.backends.assembly import SeedPlan
    from repro.backends.sglang import orchestrate
    from tests.live.live_helpers import need_parts

    need_parts()
    m = 2
    reqs = gsp(21, "random", n_groups=3, per_group=8)
    cfg = cell_cfg_014(m, eviction_interval_secs=1)  # a trim report (its map orders) each second
    cfg["backend"]["time_scale"] = 1.0  # a cell of several seconds: it outlives a trim interval
    plan = orchestrate.plan_cell(cfg, [200_000] * m, SeedPlan.spawn(0, m), tmp_path / "logs")
    res = orchestrate.run_plan(plan, reqs)
    rec = res.records.set_index("id")
    assert not rec["failed"].any() and len(rec) == len(reqs)
    served = {s["worker_id"]: s["requests_finished"] for s in res.worker_stats}
    assert sum(served.values()) == len(reqs)
    log = (Path(plan.log_dir) / "router.log").read_text(errors="replace")
    urls = plan.worker_urls
    reports = map_reports(log, {u: i for i, u in enumerate(urls)})
    (first,) = [w for w, n in served.items() if n]  # one worker took every request ...
    assert served[first] == len(reqs), served
    assert reports and first == reports[0].size_order[0], (served, reports[:1])  # ... the size map's first
    assert "panicked" not in log
