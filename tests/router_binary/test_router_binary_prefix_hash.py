"""Our smg 1.13 `prefix_hash` and `least_load` (repro/routing) against the real smg 1.13.0 binary
(make router-env), in front of holding workers (binary_harness), one request at a time.

prefix_hash: smg places workers on its ring with blake3 of their URLs, ours with blake2b of their
ids (repro/routing/prefix_hash.py), so the ring itself is learned first: every head is sent once
with all loads 0 (smg then always takes the ring's owner), and our router's `owner` becomes that
table. Then, with requests held and released at random, every decision under load must agree
with the binary's, step by step (the bound, the least-loaded fallback and its first-in-worker-order
tie rule: our ids are the registry's order here). Heads shorter / longer than
--prefix-token-count and tails past it check which tokens the key takes.

least_load: the holding workers report no load (no /get_load), so the binary scores each worker
by its in-flight count (loads: dark) and breaks ties at random: its pick must be one of our
tied minima at every step, and untied steps agree exactly.

    .venv/bin/python -m pytest -m router_binary tests/router_binary/test_router_binary_prefix_hash.py
"""

from __future__ import annotations

import asyncio
import random

import pytest

from repro.routing import LeastLoadRouter, PrefixHashRouter
from tests.router_binary.binary_harness import router_python
from tests.router_binary.test_router_binary_parity import with_router
from tests.routing.fakes import make_views

pytestmark = [pytest.mark.router_binary, pytest.mark.timeout(600)]

BINARY = "smg_1_13"
PY = None
REPORT: list[str] = []


@pytest.fixture(autouse=True)
def _smg_venv():
    """A skip in set-up (not at collection), so that under CI=true tests/conftest.py fails it."""
    global PY
    PY = PY or router_python(BINARY)
    if PY is None:
        pytest.skip("smg 1.13.0 venv missing: run `make router-env`")


def run(tmp_path, m, policy, args, body):
    return asyncio.run(with_router(tmp_path, m, policy, args, body, python=PY, binary=BINARY))


def _heads(rng: random.Random, n: int, n_prefix: int) -> list[list[int]]:
    return [[rng.randrange(1, 30000) for _ in range(n_prefix)] for _ in range(n)]


async def _learn_ring(d, order, heads, n_prefix) -> dict[bytes, int]:
    """Each head once at zero load (the ring's owner), as our worker index (= registry position)."""
    pos = {wid: j for j, wid in enumerate(order)}
    owner = {}
    for h in heads:
        real = await d.send({"input_ids": h + [7, 7]})
        await d.release(list(d.in_flight))
        await d.wait_loads([0] * d.workers.n)
        owner[PrefixHashRouter.head_of(h, n_prefix)] = pos[real]
    return owner


@pytest.mark.parametrize("abs_threshold", [1, 10])
def test_prefix_hash_step_by_step(tmp_path, abs_threshold):
    m, n_prefix = 4, 8
    args = ["--prefix-token-count", str(n_prefix), "--prefix-hash-balance-abs-threshold", str(abs_threshold)]

    async def body(d):
        rng = random.Random(abs_threshold)
        order = await d.registry_order()
        pos = {wid: j for j, wid in enumerate(order)}
        heads = _heads(rng, 12, n_prefix)
        owner = await _learn_ring(d, order, heads, n_prefix)
        # the key is the head only: another tail, the same worker (at zero load)
        for h in heads[:4]:
            real = await d.send({"input_ids": h + [rng.randrange(30000) for _ in range(5)]})
            await d.release(list(d.in_flight))
            assert pos[real] == owner[PrefixHashRouter.head_of(h, n_prefix)]
        ours = PrefixHashRouter(prefix_token_count=n_prefix, balance_abs_threshold=abs_threshold)
        ours.reset(make_views(m), 0)
        ours.owner = owner.__getitem__
        agree = decisions = fallback = 0
        held: list[str] = []
        for k in range(300):
            h = heads[min(int(rng.expovariate(0.4)), len(heads) - 1)]  # skewed: hot heads overload their owner
            loads = await d.real_loads()
            ours.in_flight = [loads[wid] for wid in order]
            want = ours.choose(PrefixHashRouter.head_of(h, n_prefix))
            fallback += want != owner[PrefixHashRouter.head_of(h, n_prefix)]
            real = pos[await d.send({"input_ids": h + [k, 1, 2]})]
            held.append(f"q{d.k - 1}")
            decisions += 1
            agree += want == real
            assert want == real, f"decision {k}: smg sent to {real}, ours {want} (loads {ours.in_flight})"
            if held and rng.random() < 0.35:
                rid = held.pop(rng.randrange(len(held)))
                await d.release([rid])
        await d.drain()
        REPORT.append(f"prefix_hash abs={abs_threshold}: {agree}/{decisions} agree, {fallback} off-owner decisions")
        assert fallback > 5  # the load bound mattered

    run(tmp_path, m, "prefix_hash", args, body)


def test_least_load_dark_fleet_step_by_step(tmp_path):
    m = 4

    async def body(d):
        rng = random.Random(5)
        ours = LeastLoadRouter(loads="dark")
        ours.reset(make_views(m), 0)
        held: list[str] = []
        decisions = tied_steps = 0
        picks: dict[int, int] = {}
        for k in range(200):
            loads = await d.real_loads()
            ours.in_flight = list(loads)
            low = min(loads)
            tied = {i for i, x in enumerate(loads) if x == low}
            real = await d.send({"input_ids": [k, 1, 2, 3]})
            held.append(f"q{d.k - 1}")
            decisions += 1
            assert real in tied, f"decision {k}: smg sent to {real}, our minima {tied} (loads {loads})"
            if len(tied) > 1:
                tied_steps += 1
                picks[real] = picks.get(real, 0) + 1
            while held and rng.random() < 0.45:
                await d.release([held.pop(rng.randrange(len(held)))])
        await d.drain()
        REPORT.append(f"least_load dark: {decisions} decisions in our minima, {tied_steps} tied, picks {picks}")
        assert tied_steps > 20 and len(picks) == m  # ties happened and were broken over every worker

    run(tmp_path, m, "least_load", [], body)


def teardown_module(module):
    for line in REPORT:
        print(line)
