"""The sim-vs-real table (repro/analysis/sim_vs_real.py) on hand-made cell folders."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from repro.analysis import sim_vs_real as svr


def _cell(folder, policy, rate, hit, lat, ttft, workers, failed=0):
    folder.mkdir(parents=True)
    summary = {"hit_rate": hit, "latency_p50_s": lat, "latency_p95_s": 2 * lat, "ttft_p50_s": ttft,
               "ttft_p95_s": 2 * ttft, "num_failed": failed, "provenance": {"policy_name": policy}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.yaml").write_text(yaml.safe_dump({"workload": {"request_rate": rate},
                                                         "cluster": {"num_workers": 2}}))
    rows = [w for w, n in enumerate(workers) for _ in range(n)]
    pd.DataFrame({"worker": rows + [-1] * failed, "failed": [False] * len(rows) + [True] * failed}).to_parquet(
        folder / "requests.parquet")


@pytest.fixture
def root(tmp_path):
    exp = svr.EXP
    for i, (hit, lat, w) in enumerate(((0.50, 0.100, (30, 18)), (0.52, 0.120, (28, 20)), (0.54, 0.110, (26, 22)))):
        _cell(tmp_path / "real" / f"rep{i + 1}" / exp / "a", "LBGR+RLT", 2.0, hit, lat, lat / 2, w)
    _cell(tmp_path / "real" / "rep1" / exp / "b", "RoundRobin+LRU", 2.0, 0.30, 0.2, 0.1, (24, 24))
    _cell(tmp_path / "sim" / exp / "a", "LBGR+RLT", 2.0, 0.545, 0.150, 0.050, (27, 21))
    _cell(tmp_path / "sim" / exp / "b", "RoundRobin+LRU", 2.0, 0.40, 0.21, 0.1, (25, 23))
    return tmp_path


def test_compare_checks_each_target(root):
    t = svr.compare(svr.collect(root))

    def row(system, metric):
        return t[(t.system == system) & (t.metric == metric)].iloc[0]

    hit = row("LBGR+RLT", "hit rate")
    assert hit.real_n == 3 and hit.real_mean == pytest.approx(52.0) and hit.sim == pytest.approx(54.5)
    assert (hit.real_min, hit.real_max) == (pytest.approx(50.0), pytest.approx(54.0))
    assert hit.within  # 2.5 points
    assert not row("RoundRobin+LRU", "hit rate").within  # 10 points
    assert not row("LBGR+RLT", "P50 latency").within  # 150 vs 110 ms: +36 %
    assert row("LBGR+RLT", "P50 TTFT").within  # 50 vs 55 ms: -9 %
    assert row("LBGR+RLT", "P95 TTFT").within is None  # no target
    busiest, least = row("LBGR+RLT", "requests, busiest worker"), row("LBGR+RLT", "requests, least busy worker")
    assert (busiest.real_min, busiest.real_max, busiest.sim) == (26, 30, 27) and busiest.within
    assert (least.real_min, least.real_max, least.sim) == (18, 22, 21) and least.within
    assert not row("RoundRobin+LRU", "requests, busiest worker").within  # 25 outside [24, 24]


def test_failed_requests_are_counted_not_routed(tmp_path):
    _cell(tmp_path / "real" / "rep1" / svr.EXP / "a", "LBGR+RLT", 2.0, 0.5, 0.1, 0.05, (20, 20), failed=8)
    (cell,) = svr.collect(tmp_path)
    assert cell.workers == (20, 20) and cell.failed == 8


def test_markdown_has_every_system_and_metric(root, tmp_path):
    text = svr.format_markdown(svr.compare(svr.collect(root)))
    assert "**2 req/s**" in text and "over 3 runs" in text
    header = next(line for line in text.splitlines() if line.startswith("| metric"))
    assert header.index("RoundRobin+LRU real") < header.index("LBGR+RLT real")  # the paper's order
    assert "| hit rate (%) | 30.0 [30.0–30.0] (n=1) | 40.0 ✗ | 52.0 [50.0–54.0] | 54.5 ✓ |" in text  # RR ran once
    out = tmp_path / "t.md"
    assert svr.main(["table", "--root", str(root), "--out", str(out)]) == 0
    assert out.read_text().strip() == text.strip() and out.with_suffix(".csv").is_file()


def test_empty_or_unfinished_root_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished live_cpu_gsp cells"):
        svr.main(["table", "--root", str(tmp_path)])
    (tmp_path / "sim" / svr.EXP / "x").mkdir(parents=True)
    (tmp_path / "sim" / svr.EXP / "x" / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="config.yaml|no requests.parquet"):
        svr.main(["table", "--root", str(tmp_path)])


def test_run_needs_the_server_python_for_real_cells(tmp_path, capsys):
    with pytest.raises(SystemExit):
        svr.main(["run", "--root", str(tmp_path), "--rates", "2"])
    assert "--python" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        svr.main(["run", "--root", str(tmp_path), "--rates", "0,x", "--skip-real"])


def test_slowdown_overrides_make_every_step_longer_by_the_factor():
    import yaml

    from repro.confutil import CONF_DIR
    from repro.costmodel.model import StepCostModel

    model = yaml.safe_load((CONF_DIR / "model" / "tiny_llama.yaml").read_text())
    hardware = yaml.safe_load((CONF_DIR / "hardware" / "cpu.yaml").read_text())
    slow = dict(model, cost_model=dict(model["cost_model"]))
    for o in svr.slowdown_overrides(model["cost_model"], 3.0):
        key, value = o.split("=")
        slow["cost_model"][key.split(".")[-1]] = float(value)
    a, b = StepCostModel.from_config(model, hardware), StepCostModel.from_config(slow, hardware)
    for args in ((300, 300 * 150.0, 0, 0), (16, 16 * 2056.0, 0, 0), (0, 0.0, 8, 8 * 400.0), (64, 64 * 32.0, 4, 1200.0)):
        assert b.step_time_s(*args) == pytest.approx(3 * a.step_time_s(*args), rel=1e-6)
    assert svr.sim_folder(1.0) == "sim" and svr.sim_folder(3.0) == "sim_slow3"


# ---------------------------------------------------------------------------- checks (a) and (b)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from repro.analysis import sim_vs_real_cache as svc  # noqa: E402


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 20))
def test_sequential_replay_without_eviction_matches_the_rule(seed, n):
    """Reference: with room for everything, request i's cached tokens are its longest common prefix
    with an earlier request's prompt + output - 1 (what a finished request leaves), capped at its
    prompt."""
    reqs = svc.eviction_trace(num_requests=n, num_prefixes=3, seed=seed)
    rng = np.random.default_rng(seed)
    outs = [[int(x) for x in rng.integers(0, 5, 4)] for _ in reqs]
    got = svc.replay_sequential(reqs, outs, capacity=100_000)
    left = []
    for r, o in zip(reqs, outs):
        prompt = r.prompt_tokens.tolist()
        want = max((_lcp(prompt, path) for path in left), default=0)
        assert got[len(left)] == min(want, len(prompt)), len(left)
        left.append(prompt + o[:-1])


def test_eviction_trace_evicts_and_hits_at_the_ci_capacities():
    reqs = svc.eviction_trace()
    outs = [[7, 8, 9, 10]] * len(reqs)
    roomy = svc.replay_sequential(reqs, outs, 100_000)
    for cap in svc.DEFAULT_CAPACITIES:
        got = svc.replay_sequential(reqs, outs, cap)
        assert 0 < sum(x > 0 for x in got) and got != roomy  # hits, and fewer than without eviction


def test_cache_table_says_exact_and_lists_differences():
    t = svc.compare_cache([svc.CacheCheck(1000, (0, 5, 7), (0, 5, 7)), svc.CacheCheck(1200, (0, 5, 7), (0, 4, 7))])
    assert t["exact"].tolist() == [True, False] and t["same cached tokens"].tolist() == [3, 2]
    assert t.iloc[1]["first differences (request: real/sim)"] == "1: 5/4"
    assert "| KV tokens |" in svc.cache_table_markdown(t)


def test_cell_table_attributes_differences():
    ok = svc.compare_cell(svc.CellCheck((1, 2), (1, 2), ()))
    assert ok.iloc[0]["exact or attributed"] and ok.iloc[0]["attributed to"] == "-"
    t = svc.compare_cell(svc.CellCheck((1, 2, 3), (1, 0, 0), (svc.OVERLAP, svc.UNEXPLAINED)))
    assert not t.iloc[0]["exact or attributed"] and "1 x unexplained" in t.iloc[0]["attributed to"]


def test_cli_refuses_a_folder_without_a_trace(tmp_path):
    with pytest.raises(SystemExit, match="trace.jsonl not found"):
        svr.main(["cell", str(tmp_path)])
