"""Observe -> replay: a live cell writes its trace (`<cell>/logs/trace.jsonl`), and the simulator
replays it (workload=trace, router=fixed) with each request on the worker that served it.

On emulated workers (the simulator's own worker behind HTTP) at a low rate, with requests far
apart, nothing depends on timing: the replay must give every request the same cached tokens and
worker as the live run did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro.backends.sglang import backend
from repro.workloads.trace import read_trace

from live_helpers import CONF, need_parts


def _compose(overrides):
    need_parts()
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides)


def test_a_live_cell_writes_a_trace_the_simulator_replays_exactly(tmp_path):
    import repro.backends.sim as sim_backend

    cfg = _compose([
        "backend=sglang", "backend.emulate=true", "backend.time_scale=5", "policy=round_robin_lru",
        "workload=gsp", "workload.num_queries=12", "workload.num_groups=2", "workload.prompts_per_group=6", "workload.request_rate=2.0", "cluster.num_workers=2",
        "cluster.kv_cache_tokens=40000", f"results_dir={tmp_path}", "exp_name=observe"])
    live = backend.run_cell(cfg)
    path = Path(live.timings["log_dir"]) / "trace.jsonl"
    rows = read_trace(path)
    rec = live.records
    assert len(rows) == len(rec) == 12 and not rec["failed"].any()
    assert rec["cached_tokens"].sum() > 0 and rec["worker"].nunique() == 2  # prefixes shared, both workers used
    assert [r["server"] for r in rows] == rec["worker"].tolist()
    assert [r["observed"]["cached_tokens"] for r in rows] == rec["cached_tokens"].tolist()
    assert all(len(r["output_ids"]) == r["output_len"] == 4 for r in rows)

    replay = sim_backend.run_cell(_compose([
        "policy=fixed_lru", "workload=trace", f"workload.path={path}", "cluster.num_workers=2",
        "cluster.kv_cache_tokens=40000", f"results_dir={tmp_path / 'sim'}"]))
    sim = replay.records.sort_values("id")
    assert sim["worker"].tolist() == rec["worker"].tolist()
    assert np.array_equal(sim["cached_tokens"].to_numpy(), rec["cached_tokens"].to_numpy()), (
        sim["cached_tokens"].tolist(), rec["cached_tokens"].tolist())

    # the same through check (b) of repro.analysis.sim_vs_real: the cell's own config, its trace
    from repro.analysis.sim_vs_real_cache import compare_cell, replay_cell
    from repro.confutil import to_plain

    check = replay_cell(path, to_plain(cfg))
    assert check.real == tuple(rec["cached_tokens"]) and check.differ == [], compare_cell(check)
