"""Checks (a) and (b) of `python -m repro.analysis.sim_vs_real` against real SGLang servers (CI's
sglang_server step; one server at a time, ~2.7 GB each).

(a) the cache alone: one server per KV size (three), the eviction trace sent one request at a
    time; the simulator's worker replays it with the server's output ids: the same cached tokens
    for every request (the simulator's KV accounting is SGLang's: prompt + output - 1).
(b) one small live cell (one server, round-robin, --disable-overlap-schedule so that no request is
    scheduled before an earlier one's KV is in the tree): its trace replayed with its assignments
    gives every request the same cached tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from repro.analysis import sim_vs_real_cache as svc
from tests.live_server.conftest import ROOT, server_python, wait_no_orphans

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(1800)]


def test_a_cache_alone_is_exact_at_three_kv_sizes(tmp_path, test_mark):
    checks = svc.run_cache_check(server_python(), svc.DEFAULT_CAPACITIES, tmp_path)
    table = svc.compare_cache(checks)
    print("\n" + svc.cache_table_markdown(table))
    assert [c.capacity for c in checks] == list(svc.DEFAULT_CAPACITIES)
    assert all(sum(x > 0 for x in c.real) > 0 for c in checks)  # the trace hits ...
    assert len({c.real for c in checks}) == 3  # ... and evicts differently at each size
    assert table["exact"].all(), table.to_string()
    assert wait_no_orphans(test_mark) == []


def test_b_a_live_cell_replayed_with_its_assignments_is_exact(tmp_path, test_mark):
    cmd = [sys.executable, "-m", "repro.run", "+exp=live_cpu_gsp", f"results_dir={tmp_path}",
           f"backend.server.python={server_python()}", "tracking=disabled", "policy=round_robin_lru",
           "cluster.num_workers=1", "workload.num_queries=16", "workload.request_rate=1.0",
           "backend.server.extra_args=[--disable-overlap-schedule]"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cell,) = [d for d in (tmp_path / "live_cpu_gsp").iterdir() if d.is_dir()]
    trace = cell / "logs" / "trace.jsonl"
    assert len(trace.read_text().splitlines()) == 16
    check = svc.replay_cell(trace, yaml.safe_load((cell / "config.yaml").read_text()))
    table = svc.compare_cell(check)
    print("\n" + svc.cache_table_markdown(table))
    assert sum(check.real) > 0 and check.differ == [], table.to_string()
    codes = json.loads((cell / "logs" / "exit_codes.json").read_text())
    assert all(c["ended"] == "stopped" for c in codes.values()), codes
    assert wait_no_orphans(test_mark) == []
