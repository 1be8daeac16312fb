"""Node orchestration: command lines, GPU assignment, process groups, health waits, whole cells
with emulated workers (start -> replay -> teardown), a worker killed mid-run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from repro.backends.sglang import orchestrate
from repro.backends.sglang.orchestrate import (ManagedProcess, OrchestrationError, ProcessSpec, ServerStartError,
                                               assign_gpus, sglang_router_command, sglang_server_command)

from live_helpers import hardware_cfg, load_yaml, make_requests, model_cfg, need_parts

SCHED = {"schedule_policy": "lpm", "max_running_requests": 256, "max_prefill_tokens": 16384,
         "chunked_prefill_size": 8192}

# Flags of `python -m sglang.launch_server` in sglang 0.5.23 that we emit (checked against
# sglang's own parser by test_server_command_parses_with_sglangs_parser where sglang is installed).
SGLANG_FLAGS = {"--model-path", "--host", "--port", "--radix-eviction-policy", "--max-total-tokens",
                "--mem-fraction-static", "--schedule-policy", "--max-running-requests", "--max-prefill-tokens",
                "--chunked-prefill-size", "--tp-size", "--random-seed", "--load-format", "--dtype",
                "--enable-metrics"}
# Flags of sglang-router 0.3.2's launch_router that we emit.
ROUTER_FLAGS = {"--host", "--port", "--worker-urls", "--policy", "--cache-threshold", "--balance-abs-threshold",
                "--balance-rel-threshold", "--eviction-interval-secs", "--max-tree-size", "--request-timeout-secs",
                "--worker-startup-timeout-secs", "--prometheus-host", "--prometheus-port"}


def _flags(cmd):
    return {a for a in cmd if a.startswith("--")}


def _server_cmd(**kw):
    args = dict(kv_cache_tokens=120_000, mem_fraction=None, tensor_parallel=2, random_seed=3, load_format="dummy",
                dtype="bfloat16", enable_metrics=True, extra_args=["--disable-overlap-schedule"])
    args.update(kw)
    return sglang_server_command("python", "meta-llama/Llama-3.1-8B-Instruct", "127.0.0.1", 30001, "rlt", SCHED,
                                 **args)


def test_server_command():
    cmd = _server_cmd()
    assert cmd[:3] == ["python", "-m", "repro.backends.sglang.server"]
    flags = _flags(cmd) - {"--disable-overlap-schedule"}
    assert flags <= SGLANG_FLAGS
    pairs = dict(zip(cmd[3::2], cmd[4::2]))
    assert pairs["--radix-eviction-policy"] == "rlt" and pairs["--max-total-tokens"] == "120000"
    assert pairs["--tp-size"] == "2" and pairs["--chunked-prefill-size"] == "8192"
    assert "--mem-fraction-static" not in cmd and cmd[-1] == "--disable-overlap-schedule"
    assert "--enable-metrics" in cmd and "--enable-metrics" not in _server_cmd(enable_metrics=False)
    cmd = _server_cmd(kv_cache_tokens=None, mem_fraction=0.85, tensor_parallel=1, load_format="auto", dtype="auto",
                      extra_args=[])
    assert "--max-total-tokens" not in cmd and cmd[cmd.index("--mem-fraction-static") + 1] == "0.85"
    assert "--tp-size" not in cmd and "--load-format" not in cmd and "--dtype" not in cmd
    off = sglang_server_command("p", "m", "h", 1, "lru", {"chunked_prefill_size": None},
                                kv_cache_tokens=None, mem_fraction=0.9)
    assert off[off.index("--chunked-prefill-size") + 1] == "-1"  # SGLang: -1 disables chunking


def test_server_command_leaves_an_unsized_running_limit_to_the_server():
    # the SGLang 0.4.6 preset's max_running_requests: null = sized from the pool, as the server does
    cmd = sglang_server_command("p", "m", "h", 1, "lru", {**SCHED, "max_running_requests": None},
                                kv_cache_tokens=None, mem_fraction=0.88)
    assert "--max-running-requests" not in cmd


@pytest.mark.sglang
def test_server_command_parses_with_sglangs_parser():
    try:  # the CPU SGLang environment imports sglang through these shims
        from repro.backends.sglang import cpu_shims

        cpu_shims.install()
    except ImportError:
        pass
    server_args = pytest.importorskip("sglang.srt.server_args")
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    cmd = sglang_server_command("python", "m", "127.0.0.1", 30001, "lru", SCHED, kv_cache_tokens=120000,
                                mem_fraction=None, tensor_parallel=2, random_seed=3, load_format="dummy",
                                dtype="bfloat16", enable_metrics=True)
    ns = p.parse_args(cmd[3:])
    assert (ns.max_total_tokens, ns.tp_size, ns.schedule_policy, ns.chunked_prefill_size) == (120000, 2, "lpm", 8192)
    assert ns.enable_metrics is True


def test_sglang_router_command():
    rc = load_yaml("router/cache_aware.yaml") if (Path(__file__).parents[2] / "conf/router/cache_aware.yaml").exists() \
        else {"name": "cache_aware", "cache_threshold": 0.3, "balance_abs_threshold": 64,
              "balance_rel_threshold": 1.5, "eviction_interval_secs": 60, "max_tree_size": 2**26}
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    cmd = sglang_router_command("python", "127.0.0.1", 30000, urls, rc, request_timeout_s=600.5,
                                worker_startup_timeout_s=60, prometheus_port=30009)
    assert cmd[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert _flags(cmd) <= ROUTER_FLAGS
    i = cmd.index("--worker-urls")
    assert cmd[i + 1:i + 3] == urls and cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--request-timeout-secs") + 1] == "601"
    assert cmd[cmd.index("--max-tree-size") + 1] == str(2**26)
    assert cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1" and cmd[cmd.index("--prometheus-port") + 1] == "30009"
    rr = sglang_router_command("python", "h", 1, urls, {"name": "round_robin"}, request_timeout_s=1,
                               worker_startup_timeout_s=1, prometheus_port=2)
    assert "--cache-threshold" not in rr
    with pytest.raises(OrchestrationError, match="router_impl=ours"):
        sglang_router_command("python", "h", 1, urls, {"name": "lbgr"}, request_timeout_s=1,
                              worker_startup_timeout_s=1, prometheus_port=2)


def test_gpu_assignment(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert assign_gpus(2, 1, None) == [["0"], ["1"]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert assign_gpus(2, 2, None) == [["4", "5"], ["6", "7"]]
    assert assign_gpus(3, 1, [1, 3, 5]) == [["1"], ["3"], ["5"]]
    with pytest.raises(OrchestrationError, match="needs 4 workers x tensor_parallel 2 = 8 GPUs"):
        assign_gpus(4, 2, None)


def _cfg(num_workers=2, emulate=True, **backend):
    need_parts()
    b = {"name": "sglang", "emulate": emulate, "time_scale": 20.0 if emulate else 1.0, "router_impl": "ours",
         "timeouts": {"server_start_s": 60, "router_start_s": 60, "request_s": 30, "cell_s": 300,
                      "shutdown_grace_s": 5}}
    b.update(backend)
    return {
        "seed": 0,
        "model": model_cfg(),
        "hardware": hardware_cfg(),
        "cluster": {"num_workers": num_workers, "mem_fraction": 0.9, "kv_cache_tokens": None, "scheduler": SCHED},
        "router": {"_target_": "repro.routing.RoundRobinRouter", "name": "round_robin"},
        "eviction": {"name": "lru", "granularity": "node"},
        "backend": b,
    }


def _seeds(m):
    need_parts()
    from repro.backends.assembly import SeedPlan

    return SeedPlan.spawn(0, m)


def test_plan_for_gpu_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    cfg = _cfg(2, emulate=False)
    cfg["cluster"]["kv_cache_tokens"] = 50_000
    plan = orchestrate.plan_cell(cfg, [50_000, 50_000], _seeds(2), tmp_path, ports=[1001, 1002, 1003])
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in plan.workers] == ["2", "3"]
    assert all(w.env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false" for w in plan.workers)
    seeds = _seeds(2)
    assert [int(w.cmd[w.cmd.index("--random-seed") + 1]) for w in plan.workers] == \
        [s % (2**31 - 1) for s in seeds.workers]
    assert plan.workers[0].cmd[plan.workers[0].cmd.index("--model-path") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert plan.workers[1].cmd[plan.workers[1].cmd.index("--port") + 1] == "1002"
    assert all("--enable-metrics" in w.cmd for w in plan.workers)  # queue_wait_s from meta_info.queue_time
    assert plan.router_url == "http://127.0.0.1:1003" and plan.client["send_reference_output"] is False
    assert plan.router.config["service"]["worker_urls"] == ["http://127.0.0.1:1001", "http://127.0.0.1:1002"]
    assert plan.router.config["service"]["time_scale"] == 1.0


def test_plan_for_emulated_workers_uses_the_simulators_seeds(tmp_path):
    seeds = _seeds(3)
    plan = orchestrate.plan_cell(_cfg(3), [111, 222, 333], seeds, tmp_path)
    assert [w.config["seed"] for w in plan.workers] == list(seeds.workers)
    assert [w.config["kv_capacity_tokens"] for w in plan.workers] == [111, 222, 333]
    assert plan.router.config["service"]["seed"] == seeds.router
    assert plan.client == {"time_scale": 20.0, "request_timeout_s": 30.0, "connect_timeout_s": 10.0,
                           "send_reference_output": True, "send_text": True}
    assert len(set(int(u.rsplit(":", 1)[1]) for u in plan.worker_urls + [plan.router_url])) == 4


def _child_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_stop_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    # the parent ignores SIGTERM: only the SIGKILL after the grace period ends it
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + code
    p = ManagedProcess(ProcessSpec("sleeper", [sys.executable, "-c", code], {}, str(tmp_path / "s.log"), "http://x"))
    p.start()
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    child = int(pidfile.read_text())
    t0 = time.monotonic()
    rc = p.stop(grace_s=0.5)
    assert rc == -signal.SIGKILL and time.monotonic() - t0 < 10
    for _ in range(100):
        if not _child_alive(child):
            break
        time.sleep(0.05)
    assert not _child_alive(child)


def test_a_server_that_exits_is_named_with_its_log_tail(tmp_path):
    code = "import sys; print('loading weights'); print('CUDA out of memory', flush=True); sys.exit(3)"
    p = ManagedProcess(ProcessSpec("server1", [sys.executable, "-c", code], {}, str(tmp_path / "server1.log"),
                                   "http://127.0.0.1:9/health"))
    p.start()
    try:
        with pytest.raises(ServerStartError) as info:
            orchestrate.wait_healthy([p], timeout_s=30)
    finally:
        p.stop(1)
    msg = str(info.value)
    assert "server1 exited with code 3" in msg and "CUDA out of memory" in msg and "server1.log" in msg


def test_a_server_that_never_becomes_healthy_times_out(tmp_path):
    code = "import time; print('still starting', flush=True); time.sleep(60)"
    p = ManagedProcess(ProcessSpec("server0", [sys.executable, "-c", code], {}, str(tmp_path / "server0.log"),
                                   "http://127.0.0.1:9/health"))
    p.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerStartError) as info:
            orchestrate.wait_healthy([p], timeout_s=1.5, interval_s=0.2)
    finally:
        p.stop(1)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "not healthy after" in msg and "server0" in msg and "still starting" in msg


def _run(cfg, requests, tmp_path, capacities=None):
    m = cfg["cluster"]["num_workers"]
    plan = orchestrate.plan_cell(cfg, capacities or [20_000] * m, _seeds(m), tmp_path / "logs")
    return plan, orchestrate.run_plan(plan, requests)


def _no_process_left(plan, died=()):
    import json

    codes = json.loads((Path(plan.log_dir) / "exit_codes.json").read_text())
    assert set(codes) == {p.name for p in plan.workers} | {plan.router.name}
    # each was alive at teardown and exited after our SIGTERM (but those in `died`: gone before it),
    # its session empty afterwards
    assert all(c["ended"] == ("died" if name in died else "stopped") and c["exit_code"] is not None
               and c["left_in_session"] == [] for name, c in codes.items()), codes


def test_a_whole_cell_on_emulated_workers(tmp_path):
    reqs = make_requests(24, prompt_len=80, output_len=3, rate=40.0, groups=3)
    plan, res = _run(_cfg(2), reqs, tmp_path)
    rec = res.records
    assert not rec["failed"].any() and sorted(rec["worker"].unique()) == [0, 1]
    assert (rec["output_tokens"] == 3).all() and rec["cached_tokens"].sum() > 0
    assert res.router_stats["completed"] == 24 and res.router_stats["callbacks"] == 24
    # backend.server.enable_metrics (default): the worker reports its queue time, latency is taken apart
    assert rec["queue_wait_s"].notna().all() and (rec["queue_wait_s"] >= 0).all() and (rec["prefill_s"] > -1e-9).all()
    parts = rec["queue_wait_s"] + rec["prefill_s"] + rec["decode_s"]
    assert np.allclose(parts, rec["finish_s"] - rec["arrival_s"], rtol=0, atol=1e-9)
    assert sum(s["requests_finished"] for s in res.worker_stats) == 24
    logs = Path(plan.log_dir)
    for name in ("plan.json", "worker0.log", "worker1.log", "router.log", "worker0.json", "router.json",
                 "client_report.json", "router_stats.json", "worker_stats.json"):
        assert (logs / name).is_file(), name
    _no_process_left(plan)


def test_workers_that_never_become_healthy_fail_fast_and_are_torn_down(tmp_path):
    cfg = _cfg(2, emulator={"fault": "never_healthy"})
    cfg["backend"]["timeouts"]["server_start_s"] = 4
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        _run(cfg, make_requests(2), tmp_path)
    assert time.monotonic() - t0 < 60
    assert "not healthy after" in str(info.value) and "worker0" in str(info.value)
    plan_dir = tmp_path / "logs"
    import json

    codes = json.loads((plan_dir / "exit_codes.json").read_text())
    assert set(codes) == {"worker0", "worker1"} and all(c["ended"] == "stopped" for c in codes.values()), codes


def test_a_worker_killed_mid_run_fails_the_cell_as_a_death_and_never_hangs(tmp_path):
    """Worker 1 dies hard when its 6th request arrives: the cell fails with ServerDiedError (not a
    start-up error) naming it, whether the watch saw it during the replay or only after it; in
    exit_codes.json worker 1 "died" (code 137) and the others were "stopped" by us."""
    reqs = make_requests(40, prompt_len=80, output_len=4, rate=60.0, groups=4)
    cfg = _cfg(2, emulator={"faults": {1: {"exit_after_requests": 6}}})
    with pytest.raises(orchestrate.ServerDiedError) as info:
        _run(cfg, reqs, tmp_path)
    assert not isinstance(info.value, ServerStartError)
    assert "worker1 exited with code 137 in the middle of the cell" in str(info.value)
    plan = orchestrate.plan_cell(cfg, [20_000] * 2, _seeds(2), tmp_path / "logs")  # the same names and folder
    _no_process_left(plan, died=("worker1",))
    codes = json.loads((tmp_path / "logs" / "exit_codes.json").read_text())
    assert codes["worker1"]["exit_code"] == 137


def test_plan_spreads_workers_over_the_nodes_of_a_slurm_job(tmp_path, monkeypatch):
    """10 workers in a 2-node job: 5 here, 5 started by node2's agent on its address; their URLs are
    placeholders until the agent reports its ports, then the router gets the real ones."""
    from repro.backends.sglang import node_agent

    nodes = [node_agent.Node("node1", "10.0.0.1"), node_agent.Node("node2", "10.0.0.2")]
    monkeypatch.setattr(node_agent, "job_nodes", lambda env=None: nodes)
    plan = orchestrate.plan_cell(_cfg(10), [20_000] * 10, _seeds(10), tmp_path / "logs")
    assert [w.node for w in plan.workers] == [None] * 5 + ["node2"] * 5
    assert all(w.cmd[w.cmd.index("--host") + 1] == "127.0.0.1" for w in plan.workers[:5])
    assert all(w.cmd[w.cmd.index("--host") + 1] == "10.0.0.2" and "{port}" in w.cmd for w in plan.workers[5:])
    assert plan.worker_urls[5:] == [f"{{url:worker{i}}}" for i in range(5, 10)]
    plan.bind_urls({f"{{url:worker{i}}}": f"http://10.0.0.2:{4000 + i}" for i in range(5, 10)})
    assert plan.router.config["service"]["worker_urls"][5:] == [f"http://10.0.0.2:{4000 + i}" for i in range(5, 10)]
    assert [w["node"] for w in plan.describe()["workers"]] == ["node1"] * 5 + ["node2"] * 5
    assert node_agent.split_workers(9, nodes) == [0] * 5 + [1] * 4
    # placement: local keeps everything here
    cfg = _cfg(10)
    cfg["backend"]["placement"] = "local"
    assert all(w.node is None for w in orchestrate.plan_cell(cfg, [20_000] * 10, _seeds(10), tmp_path / "l").workers)


def test_live_cells_stream_per_worker_state_from_the_router_stats():
    """In flight / queue / KV-use curves of a live cell come from the router service's /stats."""
    import asyncio

    from aiohttp import web

    from repro.backends.sglang import protocol
    from repro.backends.sglang.orchestrate import _stream_worker_state

    polls = []

    async def stats(_request):
        polls.append(1)
        return web.json_response({"workers": [
            {"worker_id": 0, "in_flight": len(polls), "waiting": 1, "active_kv_tokens": 100 * len(polls)},
            {"worker_id": 1, "in_flight": 0, "waiting": 0, "active_kv_tokens": 0}]})

    async def main():
        app = web.Application()
        app.router.add_get("/stats", stats)
        runner, port = await protocol.serve_app(app)
        points = []
        task = asyncio.ensure_future(_stream_worker_state(f"http://127.0.0.1:{port}", points.append, every_s=0.05))
        try:
            while len(points) < 3:
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.cleanup()
        return points

    points = asyncio.run(asyncio.wait_for(main(), 20))
    assert points[0] == {"in_flight/w0": 1, "queue/w0": 1, "kv_use/w0": 100,
                         "in_flight/w1": 0, "queue/w1": 0, "kv_use/w1": 0}
    assert [p["in_flight/w0"] for p in points[:3]] == [1, 2, 3]
