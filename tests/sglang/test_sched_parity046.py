"""Scheduler parity under the SGLang 0.4.6 preset: our SimWorker (`prefill_adder: sglang_0_4_6`)
against SGLang 0.4.6's own SchedulePolicy / PrefillAdder, state by state.

SGLang 0.4.6 runs in a process of its own (tests/sglang/sched046_driver.py; .venv-sglang046 from
scripts/make_sglang046_env.sh): the listed cases of test_sched_parity.py and generated states at
new_token_ratio 1.0, 0.7 (0.4.6's initial value) and 0.098 (its floor). Every decision kind
(order, admitted, chunk, credited prefix, tree) must agree, except where our full output
reservation (the simulator never retracts) refuses a request that 0.4.6's ratio-discounted
budget admits: there ours must admit a prefix of 0.4.6's batch and say "physical"; at ratio 1.0
that never happens.

    make sglang046-env && .venv-sglang/bin/python -m pytest -m sglang tests/sglang/test_sched_parity046.py
    PYTHONPATH=. .venv-sglang/bin/python -m tests.sglang.sched046_driver 3000   # the rates
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sglang import sched046_driver as E

pytestmark = pytest.mark.sglang
ROOT = Path(__file__).resolve().parents[2]
N_GENERATED = 3000


@pytest.fixture(scope="module")
def results():
    site = Path(E.site_dir())
    if not (site / "sglang").is_dir():
        pytest.skip(f"SGLang 0.4.6 is not installed in {site} (make sglang046-env)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sglang.sched046_driver", str(N_GENERATED), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_it_is_sglang_0_4_6(results):
    assert results["sglang"] == "0.4.6"
    assert Path(results["sglang_file"]).resolve().is_relative_to(Path(E.site_dir()).resolve())


def test_listed_cases(results):
    for name, by_ratio in results["cases"].items():
        assert not by_ratio["1.0"]["diff"], (name, by_ratio["1.0"]["diff"])
        r = by_ratio[str(E.INIT_RATIO)]
        assert not r["diff"] or r["physical"], (name, r["diff"])


def test_generated_states(results, capsys):
    gen = results["generated"]
    assert len(gen) == N_GENERATED
    exact = [g for g in gen if not g["diff"]]
    physical = [g for g in gen if g["diff"] and g["physical"]]
    other = [g for g in gen if g["diff"] and not g["physical"]]
    with capsys.disabled():
        print(
            f"\n{N_GENERATED} generated states vs SGLang 0.4.6: {len(exact)} identical, {len(physical)} refused by "
            f"our full output reservation only, {len(other)} other; the 0.5.23 rules would differ on "
            f"{sum(g['v0523_differs'] for g in gen)}"
        )
    assert not other, other[:3]
    assert all(not g["diff"] for g in gen if g["ratio"] == 1.0)
    assert len(physical) <= 0.05 * N_GENERATED
    # the states reach what separates 0.4.6 from 0.5.23, and every listed case
    assert sum(g["v0523_differs"] for g in gen) >= 0.01 * N_GENERATED
    cover = {}
    for g in gen:
        for tag in g["tags"]:
            cover[tag] = cover.get(tag, 0) + 1
    for case in (
        "lpm_shared_prefix",
        "in_batch_prefix_rule",
        "fcfs_fallback_over_128",
        "fcfs",
        "budget_edge",
        "chunked_continuing",
        "new_chunk",
        "memory_too_full_to_admit",
        "max_running_requests",
    ):
        assert cover.get(case, 0) >= 0.01 * N_GENERATED, (case, cover)
