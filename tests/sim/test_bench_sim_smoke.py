"""The speed benchmark's parts run on a tiny cell and print the issue-20 table (bench_sim.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sim.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sim", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_issue20_table_on_a_tiny_cell(capsys):
    b = _bench()
    bests, alone = {}, []
    for router, ev in (("lbgr", "rlt"), ("cache_aware", "lru")):
        parts = b.build_parts(48, 0, router, ev)
        assert "fake" not in " ".join(parts.used.values())  # the real parts, not the fallbacks
        best = b.run_once(parts)
        best["cpu_best_s"] = best["cpu_s"]
        bests[(router, ev)] = best
        ref = b.run_once(parts, constant_cache=True, router=b.trivial_router)
        assert ref["hit_rate"] == 0.0 and best["hit_rate"] > 0.0
        alone.append(ref)
    b.issue20_summary(bests, alone, SimpleNamespace(no_vidur=True, repeat=1))
    out = capsys.readouterr().out
    assert "simulator alone" in out and "lbgr+RLT" in out and "cache_aware+LRU" in out
    assert "40,000" in out and "60,000" in out
    # the per-request budget table: what each target allows, and the run's split adding up to its wall time
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip().startswith(("lbgr+", "cache_aware+"))}
    assert float(lines["lbgr+RLT"][1]) == 25.0 and float(lines["cache_aware+LRU"][1]) == 16.7
    for (router, ev), best in bests.items():
        row = lines[f"{router}+{ev.upper()}"]
        assert abs(float(row[5]) - best["wall_s"] * 1e6 / 48) < 0.2
