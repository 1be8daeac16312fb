"""protocol=artifact on real SGLang servers (tiny random-weight Llama on this CPU): what
`backend=sglang protocol=artifact` launches on GPU nodes, shrunk (conf/exp/live_cpu_artifact.yaml).

One GSP cell per system, each a normal cell folder from `python -m repro.run` in a subprocess (two
servers at a time, started and stopped by the cell): the warm-up-then-Poisson client, prompts sent as
text alone, the artifact metrics, the shipped policies seen running — rlt_shipped's own eviction
line in the servers' logs, the router service's policy in its log — and nothing left running. One
multi-turn cell runs the closed loop on real servers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.live_server.conftest import ROOT, server_python, wait_no_orphans

pytestmark = [pytest.mark.sglang_server, pytest.mark.timeout(3600)]

# the six systems (protocol.systems of artifact.yaml) by policy_name -> (router class in the router
# service's log, the servers' eviction policy)
SYSTEMS = {
    "CacheAware014+LRU": ("CacheAwareRouter", "lru"),
    "LBGRShipped+RLT-shipped": ("LBGRShippedRouter", "rlt_shipped"),
    "CacheAware014+RLT-shipped": ("CacheAwareRouter", "rlt_shipped"),
    "LBGRShipped+LRU": ("LBGRShippedRouter", "lru"),
    "Random+LRU": ("RandomRouter", "lru"),
    "RoundRobin+LRU": ("RoundRobinRouter", "lru"),
}


def _run(results: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "repro.run", "+exp=live_cpu_artifact", "protocol=artifact",
           f"results_dir={results}", f"backend.server.python={server_python()}", "tracking=disabled", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000)


def _cells(results: Path) -> dict[str, Path]:
    out = {}
    for d in (c for folder in results.glob("live_cpu_artifact*") for c in folder.iterdir()):  # +<override> folders too
        if (d / "summary.json").is_file():
            prov = json.loads((d / "summary.json").read_text())["provenance"]
            out[prov["policy_name"]] = d
    return out


def _check_cell(cell: Path, policy: str) -> dict:
    summary = json.loads((cell / "summary.json").read_text())
    prov = summary["provenance"]
    assert prov["ran_on"] == "SGLang servers on CPU" and prov["router_impl"] == "ours"
    assert prov["metric_definition"] == "artifact" and summary["num_failed"] == 0
    assert 0 < summary["hit_rate"] < 1 and summary["latency_p50_s"] > 0
    loop = prov["client_loop"]
    records = pd.read_parquet(cell / "requests.parquet")
    assert len(records) == loop["sent"] == summary["num_requests"] and (records["output_tokens"] == 4).all()
    assert prov["server_preset_gaps"] and any("whole allocation" in g for g in prov["server_preset_gaps"])
    logs = cell / "logs"
    plan = json.loads((logs / "plan.json").read_text())
    assert plan["client"]["send_ids"] is False  # text alone, as their clients send it
    for w in plan["workers"]:  # the preset's flags that 0.5.23 has
        assert "--schedule-policy fcfs" in w["cmd"] and "--chunked-prefill-size 8192" in w["cmd"]
        assert "--max-prefill-tokens 16384" in w["cmd"] and "--max-running-requests" not in w["cmd"]
    router_cls, eviction = SYSTEMS[policy]
    assert f"router service ({router_cls})" in (logs / "router.log").read_text()
    evictions = [e for e in prov["server_evictions"] if e]
    assert evictions and all(e["policy"] == eviction for e in evictions), prov["server_evictions"]
    return summary


# CI runs three of the six (each cell starts its own servers): both shipped routers' classes and both
# evictions; Random and RoundRobin run the same server code as the text protocol's cells
IN_CI = ("CacheAware014+LRU", "CacheAware014+RLT-shipped", "LBGRShipped+RLT-shipped")


def test_the_artifact_protocol_on_real_servers(tmp_path, test_mark):
    proc = _run(tmp_path, "policy=cache_aware_014_lru,cache_aware_014_rlt_shipped,lbgr_shipped_rlt_shipped")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    cells = _cells(tmp_path)
    assert set(cells) == set(IN_CI), sorted(cells)
    for policy, cell in cells.items():
        summary = _check_cell(cell, policy)
        loop = summary["provenance"]["client_loop"]
        assert loop["client"] == "warmup_then_open_loop" and loop["sent"] == 1 + 8 * 4  # warm-up + 8 groups x 4
    # the closed loop (multi-turn.py) on the same servers: 4 in flight, every turn, duplicates on top
    proc = _run(tmp_path / "chat", "workload=sharegpt", "policy=lbgr_shipped_rlt_shipped")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (cell,) = _cells(tmp_path / "chat").values()
    loop = _check_cell(cell, "LBGRShipped+RLT-shipped")["provenance"]["client_loop"]
    # warm-up + 8 conversations cut to 2 / 4 turns in rotation (24 turns), duplicate draws on top
    assert loop["client"] == "closed_loop" and loop["max_in_flight"] <= 4 and loop["sent"] >= 1 + 24
    assert wait_no_orphans(test_mark) == []
