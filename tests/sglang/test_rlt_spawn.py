"""The RLT patch reaches a process spawned the way SGLang 0.5.23 spawns its schedulers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
CPU_SITE = Path(__file__).resolve().parent / "cpu_site"
PATCH_KEYS = ("rlt_in_name_table", "rlt_in_cli_choices", "radix_backend_registered", "radix_cache_hooked")


def _run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CPU_SITE), str(REPO)])
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def _last_json(stdout: str) -> dict:
    start = stdout.index("{")
    return json.loads(stdout[start:])


def test_engine_still_spawns_schedulers_the_way_the_patch_relies_on(sg):
    """SGLang 0.5.23's engine: mp.set_start_method("spawn", force=True), then mp.Process(...)."""
    import importlib.util

    # read, not import: importing the engine needs the serving stack (uvloop, ...), absent on CPU
    src = Path(importlib.util.find_spec("sglang.srt.entrypoints.engine").origin).read_text()
    assert 'mp.set_start_method("spawn", force=True)' in src
    assert "mp.Process(" in src and "run_scheduler_process" in src


def test_server_entry_point_patches_spawned_children(sg):
    proc = _run_module("repro.backends.sglang.server", "--check-spawn")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = _last_json(proc.stdout)
    assert state["pid"] != state["parent"]["pid"]
    for key in PATCH_KEYS:
        assert state[key] is True, (key, state)
        assert state["parent"][key] is True


def test_patch_applied_only_under_main_guard_does_not_reach_children(sg):
    proc = _run_module("tests.sglang.spawn_probe_late_apply")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = _last_json(proc.stdout)
    assert state["parent"]["rlt_in_name_table"] is True
    assert state["rlt_in_name_table"] is False and state["radix_cache_hooked"] is False


def test_server_argv_selects_the_patched_cache(rlt):
    from repro.backends.sglang.server import build_sglang_argv

    base = ["--model-path", "m"]
    # not rlt: the same tree class (SGLang's plain RadixCache), unless a backend is named or the cache is off
    assert build_sglang_argv(base) == base + ["--radix-cache-backend", "repro_radix"]
    assert build_sglang_argv(base + ["--radix-eviction-policy", "lru"])[-2:] == ["--radix-cache-backend", "repro_radix"]
    assert build_sglang_argv(base + ["--radix-cache-backend", "unified"]) == base + ["--radix-cache-backend", "unified"]
    assert build_sglang_argv(base + ["--disable-radix-cache"]) == base + ["--disable-radix-cache"]
    assert build_sglang_argv(base + ["--radix-cache-backend", "sglang-default"]) == base  # SGLang's own chain
    with pytest.raises(SystemExit, match="UnifiedRadixCache"):
        build_sglang_argv(base + ["--radix-eviction-policy", "rlt", "--radix-cache-backend=sglang-default"])
    out = build_sglang_argv(base + ["--radix-eviction-policy", "rlt", "--random-seed", "5"])
    assert out[-4:] == ["--radix-cache-backend", "repro_radix", "--radix-eviction-policy-config", '{"seed": 5}']
    out = build_sglang_argv(base + ["--radix-eviction-policy=rlt", "--radix-eviction-policy-config", '{"seed": 1}'])
    assert out.count("--radix-eviction-policy-config") == 1 and out[-2:] == ["--radix-cache-backend", "repro_radix"]
    with pytest.raises(SystemExit, match="RadixCache"):
        build_sglang_argv(base + ["--radix-eviction-policy", "rlt", "--radix-cache-backend", "flexkv"])
    with pytest.raises(SystemExit, match="disable-radix-cache"):
        build_sglang_argv(base + ["--radix-eviction-policy", "rlt", "--disable-radix-cache"])


def test_sglang_cli_accepts_rlt_and_builds_our_cache(rlt):
    """SGLang's own argument parser takes the argv the entry point builds."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from repro.backends.sglang.server import build_sglang_argv

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = build_sglang_argv(["--model-path", "m", "--radix-eviction-policy", "rlt", "--random-seed", "3"])
    ns = parser.parse_args(argv)
    assert ns.radix_eviction_policy == "rlt"
    assert ns.radix_cache_backend == "repro_radix"
    assert ns.radix_eviction_policy_config == {"seed": 3}
