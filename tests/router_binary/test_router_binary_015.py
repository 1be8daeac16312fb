"""Our `generation: le_0_1_4` rule on the request text against the real sglang-router 0.1.5 wheel
(make router-env builds .venv-router015), decision by decision.

Why 0.1.5: the 0.1.4 wheel routes every request on the empty key (test_router_binary_014.py), so
its tree is never exercised; the paper's authors built 0.1.4's source with a request reader that
reads `text`. 0.1.5's cache-aware decision and its tree.rs are 0.1.4's code (metrics added), with
a reader that reads `text`: the rule as the authors ran it, hits and the tree included. Its two map
orders come from its trim report (test_router_binary_014.py); where a hit's node holds several
tenants the binary's per-node hash order picks, which the test follows (the pick must be one of
the node's tenants, and the same whenever that node is met with the same tenants) and counts;
the reversed order must then decide otherwise somewhere. The binary's own size report must equal
our tree's sizes at every check. No trims: a match's stamp on a node of several tenants goes to
the tenant that node's hash order puts first, which only a hit reveals.
Run: `make test-router-binary` (pytest -m router_binary).
"""

from __future__ import annotations

import random

import pytest

from tests.router_binary.binary_harness import Driver, router_python
from tests.router_binary.test_router_binary_014 import MULTIBYTE, finish, gsp, rest_differ, run, start

pytestmark = [pytest.mark.router_binary, pytest.mark.timeout(600)]

BINARY = "0.1.5"
ALL_LOW = {"hit", "low_match_tied", "low_match_untied"}
REPORT: list[str] = []


@pytest.fixture(autouse=True)
def _router015_venv():
    """A skip in set-up (not at collection), so that under CI=true tests/conftest.py fails it."""
    if router_python(BINARY) is None:
        pytest.skip("sglang-router 0.1.5 venv missing: run `make router-env`")


def done(name, pair, branches, hash_hits=True):
    finish(name, pair, branches)
    REPORT.append(
        f"{name}: {pair.decisions} decisions, {pair.step_agree} / {pair.closed_agree} agree, "
        f"{pair.hash_order_hits} hits by hash order"
    )
    if hash_hits:
        assert pair.hash_order_hits > 0 and pair.differs["reversed_hash_order"] > 0


async def gsp_traffic(pair, requests, rng, p_release=0.3, to_text=None, report_every=40):
    for i, q in enumerate(requests):
        t = to_text(q.text) if to_text else q.text
        await pair.send({"text": t}, t)
        await pair.release_some(rng, p_release)
        if i % report_every == report_every - 1:
            await pair.check_report()
    await pair.release(list(pair.d.in_flight))
    await pair.check_report()


@pytest.mark.parametrize("order", ["random", "round_robin"])
def test_gsp_sequential(tmp_path, order):
    async def body(d: Driver):
        pair = await start(d, match_on="text")
        await gsp_traffic(pair, gsp(11, order), random.Random(1))
        done(f"text_gsp_{order}", pair, ALL_LOW, hash_hits=False)

    run(tmp_path, 3, [], body, BINARY)


def test_bursts_lowered_thresholds(tmp_path):
    cfg = {"balance_abs_threshold": 4, "balance_rel_threshold": 1.5}

    async def body(d: Driver):
        pair = await start(d, cfg, "text")
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
        done("text_bursts_lowered_thresholds", pair, ALL_LOW | {"imbalanced"})
        assert pair.differs["loads_in_size_order"] > 0 or not rest_differ(pair.report)

    run(tmp_path, 3, ["--balance-abs-threshold", "4", "--balance-rel-threshold", "1.5"], body, BINARY)


def test_defaults_with_190_in_flight(tmp_path):
    async def body(d: Driver):
        pair = await start(d, match_on="text")
        for q in gsp(13, "random", n_groups=2, per_group=95):
            await pair.send({"text": q.text}, q.text)
        rep = await pair.check_report()
        assert sum(rep.loads) == 190
        await pair.release(list(d.in_flight))
        await pair.check_report()
        done("text_defaults_190_in_flight", pair, {"hit", "imbalanced", "low_match_tied"})

    run(tmp_path, 3, [], body, BINARY)


def test_brand_new_prefixes_tied_and_untied(tmp_path):
    async def body(d: Driver):
        pair = await start(d, match_on="text")
        rng = random.Random(3)
        letters = "abcdefghijklmnopqrstuvwxyz"
        for i in range(120):
            text = "".join(rng.choice(letters) for _ in range(60))
            await pair.send({"text": text}, text)
            if i % 3 == 2:
                await pair.release(list(d.in_flight))
            else:
                await pair.release_some(rng, 0.3)
        await pair.release(list(d.in_flight))
        await pair.check_report()
        done("text_brand_new_prefixes", pair, {"low_match_tied", "low_match_untied"}, hash_hits=False)

    run(tmp_path, 2, [], body, BINARY)


def test_threshold_edge_0500_0501(tmp_path):
    async def body(d: Driver):
        pair = await start(d, match_on="text")
        rng = random.Random(4)
        edge = []
        for i in range(50):
            base = f"{i:04d}" + "".join(rng.choice("abcdefghij") for _ in range(996))
            await pair.send({"text": base}, base)
            for n in (500, 501):  # n of 1000 characters match: 0.500 is a miss, 0.501 a hit
                text = base[:n] + "".join(rng.choice("KLMNOPQRST") for _ in range(1000 - n))
                await pair.send({"text": text}, text)
                edge.append((n, pair.step.last_branch))
            await pair.release(list(d.in_flight))
        await pair.check_report()
        assert all((b == "hit") == (n == 501) for n, b in edge), edge
        done("text_threshold_edge", pair, ALL_LOW, hash_hits=False)

    run(tmp_path, 2, [], body, BINARY)


def test_multibyte_text(tmp_path):
    async def body(d: Driver):
        pair = await start(d, match_on="text")
        await gsp_traffic(pair, gsp(14, "random"), random.Random(5), to_text=lambda t: t.translate(MULTIBYTE))
        done("text_multibyte", pair, ALL_LOW, hash_hits=False)

    run(tmp_path, 3, [], body, BINARY)


def teardown_module(module):
    print("\n".join(["", "router-binary agreement (sglang-router 0.1.5, text):", *REPORT]))
