"""The real-server path's planning and checks, without starting a server (default suite).

hardware=cpu + model=tiny_llama: the project-written model directory, the CPU flags and environment
from the hardware's `server:` block (and none of them on a GPU hardware), the servers' interpreter,
validation before anything starts; RLT's order-free clocks and the servers' eviction log line.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from live_helpers import CONF, ROOT
from repro.backends.sglang import tiny_model
from repro.backends.sglang.backend import validate_cell
from repro.backends.sglang.config import hardware_server
from repro.backends.sglang.planning import plan_cell
from repro.backends.sglang.rlt_patch import EVICT_LOG_PREFIX, _exp1, _mix64, eviction_log_stats
from repro.confutil import to_plain

CPU_ONLY = ("--device", "cpu", "torch_native", "--sleep-on-idle")


def _cfg(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return to_plain(compose("config", overrides=list(overrides)))


def _plan(cfg: dict, tmp_path):
    from repro.backends import assembly

    cell = assembly.assemble(cfg, components=False)
    return plan_cell(cfg, list(cell.plan.capacities), cell.plan.seeds, tmp_path)


def test_tiny_model_dir_is_written_once_and_named_by_its_content(tmp_path):
    model = _cfg("model=tiny_llama")["model"]
    first = tiny_model.ensure_model_dir(model, tmp_path)
    assert sorted(p.name for p in first.iterdir()) == ["config.json", "generation_config.json", "tokenizer.json",
                                                        "tokenizer_config.json"]
    config = json.loads((first / "config.json").read_text())
    arch = model["architecture"]
    assert config["num_hidden_layers"] == arch["num_layers"] == 2 and config["hidden_size"] == arch["hidden_size"]
    assert config["vocab_size"] == 128256 and config["rope_theta"] == model["hf_config"]["rope_theta"]
    stamp = (first / "config.json").stat().st_mtime_ns
    assert tiny_model.ensure_model_dir(model, tmp_path) == first  # found, not rewritten
    assert (first / "config.json").stat().st_mtime_ns == stamp
    wider = dict(model, architecture=dict(arch, hidden_size=256))
    assert tiny_model.ensure_model_dir(wider, tmp_path) != first  # another model, another folder
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # no half-written folder left


def test_generated_model_needs_a_dense_llama(tmp_path):
    model = _cfg("model=mixtral_8x7b")["model"]
    with pytest.raises(tiny_model.ModelDirError, match="dense"):
        tiny_model.hf_config(model)


def test_cpu_plan_carries_the_cpu_flags_and_environment(tmp_path):
    cfg = _cfg("exp=live_cpu_gsp", "policy=cache_aware_rlt")
    plan = _plan(cfg, tmp_path)
    assert len(plan.workers) == 2
    for w in plan.workers:
        assert w.cmd[0].endswith(".venv-sglang/bin/python") and str(ROOT) in w.cmd[0]  # from the project root
        assert w.cmd[1:3] == ["-m", "repro.backends.sglang.server"]
        for flag in CPU_ONLY:
            assert flag in w.cmd, flag
        assert w.cmd[w.cmd.index("--max-total-tokens") + 1] == "2048"
        assert w.cmd[w.cmd.index("--load-format") + 1] == "dummy"
        assert w.cmd[w.cmd.index("--radix-eviction-policy") + 1] == "rlt"
        model_dir = w.cmd[w.cmd.index("--model-path") + 1]
        assert (Path(model_dir) / "config.json").is_file()
        assert w.env["SGLANG_USE_CPU_ENGINE"] == "1" and w.env["OMP_NUM_THREADS"] == "1"
        assert w.env["REPRO_SGLANG_CPU_SHIMS"] == "1" and "CUDA_VISIBLE_DEVICES" not in w.env
    assert plan.gpus == [[], []]
    # the router and client stay in the harness's interpreter
    assert ".venv-sglang" not in plan.router.cmd[0]


def test_gpu_plan_gets_nothing_cpu_only(tmp_path):
    cfg = _cfg("exp=fig2_main", "backend=sglang", "cluster.num_workers=2", "hardware=h200",
               "backend.server.model_path=/models/llama", "backend.gpus=[0,1]")
    plan = _plan(cfg, tmp_path)
    for i, w in enumerate(plan.workers):
        assert not any(flag in w.cmd for flag in CPU_ONLY), w.cmd
        assert "SGLANG_USE_CPU_ENGINE" not in w.env and "REPRO_SGLANG_CPU_SHIMS" not in w.env
        assert w.env["CUDA_VISIBLE_DEVICES"] == str(i)


def test_validation_of_real_server_cells():
    import sys

    ok = _cfg("exp=live_cpu_gsp", f"backend.server.python={sys.executable}")  # any interpreter that exists
    assert validate_cell(ok) == []
    errs = validate_cell(_cfg("exp=live_cpu_gsp", "cluster.kv_cache_tokens=null"))
    assert any("cluster.kv_cache_tokens" in e and "without GPUs" in e for e in errs), errs
    errs = validate_cell(_cfg("exp=live_cpu_gsp", "backend.server.model_path=/nonexistent/model-dir"))
    assert any("/nonexistent/model-dir" in e and "not a directory" in e for e in errs), errs
    errs = validate_cell(_cfg("exp=live_cpu_gsp", "backend.server.python=/nonexistent/bin/python"))
    assert any("backend.server.python" in e and "not an executable" in e for e in errs), errs
    errs = validate_cell(_cfg("exp=live_cpu_gsp", "+hardware.server.gpu_count=1"))
    assert any("hardware.server: unknown keys ['gpu_count']" in e for e in errs), errs


def test_hardware_server_block():
    assert hardware_server(None) == {"extra_args": [], "env": {}, "uses_gpus": True}
    cpu = hardware_server(_cfg("hardware=cpu")["hardware"])
    assert cpu["uses_gpus"] is False and "--device" in cpu["extra_args"]
    with pytest.raises(ValueError, match="unknown keys"):
        hardware_server({"server": {"flags": []}})


def test_server_python_is_not_part_of_the_signature():
    from repro.backends.sglang.backend import identity
    from repro.results import run_signature

    a = _cfg("exp=live_cpu_gsp", "backend.server.python=/opt/a/python")
    b = _cfg("exp=live_cpu_gsp", "backend.server.python=/opt/b/python")
    assert run_signature(identity(a)) == run_signature(identity(b))


def reference_exp1(seed: int, epoch: int, node_id: int) -> float:
    """splitmix64 as published (Steele et al.), written out step by step, then Exp(1) by inversion."""
    def step(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        return z ^ (z >> 31)

    h = step(step(step(seed) ^ epoch) ^ node_id)
    return -math.log(1.0 - (h >> 11) / 2**53)


def test_rlt_clocks_depend_only_on_seed_heap_build_and_node():
    rng = np.random.default_rng(3)
    for _ in range(200):
        seed, epoch, node = (int(x) for x in rng.integers(0, 2**40, size=3))
        assert _exp1(_mix64(seed), epoch, node) == pytest.approx(reference_exp1(seed, epoch, node), rel=1e-12)
    # Exp(1): mean 1 and variance 1 over many nodes (a wrong hash or scaling shows here)
    draws = [_exp1(_mix64(5), 1, n) for n in range(20000)]
    assert abs(statistics.fmean(draws) - 1.0) < 0.03 and abs(statistics.pvariance(draws) - 1.0) < 0.06
    assert _exp1(_mix64(5), 1, 7) != _exp1(_mix64(6), 1, 7) != _exp1(_mix64(5), 2, 7)


def test_eviction_log_line_is_parsed_from_a_server_log():
    assert eviction_log_stats("no evictions here\n") is None
    log = (f"[t] {EVICT_LOG_PREFIX} policy=rlt asked=14 evicted=38 total=100 random=90 fallback=10 resets=2 phase=3\n"
           "[t] INFO: something else\n"
           f"[t] {EVICT_LOG_PREFIX} policy=rlt asked=5 evicted=9 total=109 random=99 fallback=10 resets=2 phase=3\n")
    assert eviction_log_stats(log) == {"policy": "rlt", "asked": 5, "evicted": 9, "total": 109, "random": 99,
                                      "fallback": 10, "resets": 2, "phase": 3}


def test_a_server_that_lost_its_port_fails_at_once(tmp_path):
    """SGLang's HTTP server that cannot bind logs it and lives on; the wait reads the log instead of
    waiting for timeouts.server_start_s. A port taken before the start is refused before it."""
    import socket
    import sys

    from repro.backends.sglang.planning import ProcessSpec, ServerStartError, free_ports
    from repro.backends.sglang.processes import ManagedProcess, check_port_free, wait_healthy

    port = free_ports(1)[0]
    code = ("import sys, time; print('ERROR: [Errno 98] error while attempting to bind: address already in use', "
            "flush=True); time.sleep(600)")
    spec = ProcessSpec("server0", [sys.executable, "-c", code], {}, str(tmp_path / "server0.log"),
                       f"http://127.0.0.1:{port}/health")
    proc = ManagedProcess(spec)
    proc.start()
    try:
        with pytest.raises(ServerStartError, match="cannot become healthy .*address already in use"):
            wait_healthy([proc], 600.0)
    finally:
        proc.stop(5.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = ProcessSpec("server1", ["true"], {}, str(tmp_path / "s1.log"),
                           f"http://127.0.0.1:{taken.getsockname()[1]}/health")
        with pytest.raises(ServerStartError, match="server1: port .* already in use"):
            check_port_free(busy)
    check_port_free(spec)  # free again once the first one stopped
