"""Ports planned for servers that bind them later: picked below the kernel's ephemeral range (where no
outgoing connection or bind(0) can take them meanwhile), and a router whose port was taken anyway
moves to a fresh one instead of failing the cell (CI, stop 36)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

from repro.backends.sglang import orchestrate, ports

from live_helpers import make_requests
from test_live_orchestrate import _cfg, _no_process_left, _seeds


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range():
    low = ports.ephemeral_low()
    avoid = set(ports.candidate_ports()[::2])  # half of them: the picks must come from the other half
    for _ in range(20):
        picked = ports.pick_free_ports(5, avoid=avoid)
        assert len(set(picked)) == 5 and not set(picked) & avoid
        assert all(p < low and not 22000 <= p <= 29999 for p in picked), picked
        assert all(_bindable(p) for p in picked)


def test_a_port_in_use_is_never_picked(monkeypatch):
    """Only one candidate left, and it is taken: the picks fall back to bind(0), never to the taken one."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "candidate_ports", lambda: [busy])
        picked = ports.pick_free_ports(3)
        assert busy not in picked and len(set(picked)) == 3


def test_move_router_rewrites_the_real_routers_ports(tmp_path):
    plan = orchestrate.plan_cell(
        _cfg(2, router_impl="sglang_router"), [20_000] * 2, _seeds(2), tmp_path, ports=[1001, 1002, 1003]
    )
    cmd = plan.router.cmd
    assert cmd[cmd.index("--port") + 1] == "1003"
    plan.move_router(2003, 2004)
    cmd = plan.router.cmd
    assert cmd[cmd.index("--port") + 1] == "2003" and cmd[cmd.index("--prometheus-port") + 1] == "2004"
    assert plan.router_url == "http://127.0.0.1:2003" and plan.router.health_url == "http://127.0.0.1:2003/readiness"
    assert plan.local_ports == [1001, 1002, 2003]
    assert "http://127.0.0.1:1001" in cmd  # the workers stay where they are


def test_a_router_whose_port_was_taken_moves_and_the_cell_finishes(tmp_path):
    plan = orchestrate.plan_cell(_cfg(2), [20_000] * 2, _seeds(2), tmp_path / "logs")
    planned = urlsplit(plan.router_url).port
    with socket.socket() as thief:  # takes the router's port after planning, before the router starts
        thief.bind(("127.0.0.1", planned))
        thief.listen(1)
        res = orchestrate.run_plan(plan, make_requests(12, prompt_len=40, output_len=2, rate=40.0, groups=2))
    assert not res.records["failed"].any() and len(res.records) == 12
    assert res.router_port_moves == 1
    moved = urlsplit(plan.router_url).port
    assert moved != planned and moved < ports.ephemeral_low()
    logs = Path(plan.log_dir)
    log = (logs / "router.log").read_text()
    assert "address already in use" in log.lower() and log.count(" start: ") == 2
    assert "Unclosed client session" not in log  # the failed start closed what it had opened
    assert json.loads((logs / "plan.json").read_text())["router_url"] == plan.router_url
    _no_process_left(plan)
