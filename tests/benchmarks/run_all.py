"""`make bench`: run the speed benchmarks one after another and print their tables.

Each benchmark measures the things it compares side by side in one process (ratios, not
absolute times, are what carry across machines). The SGLang comparison needs the CPU SGLang
environment (`make sglang-env`); without it that benchmark is reported as not run.

    python3 tests/benchmarks/run_all.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"

# name -> (script, extra args for --quick, what it checks)
BENCHMARKS: dict[str, tuple[str, list[str], str]] = {
    "kvcache": ("bench_kvcache.py", ["--quick"], "radix tree throughput; RLT vs LRU cost per evicted token"),
    "sglang": ("bench_sglang.py", ["--quick"], "our tree vs SGLang's RadixCache, same trace (target >= 3x)"),
    "routing": ("bench_routing.py", ["--quick"],
                "decision latency per router (LBGR p50 <= 100 us at M=10, 4k; issue 20: <= 15 us at M=10, "
                "<= 20 us at M=64, beside cache-aware)"),
    "sim": ("bench_sim.py", ["--repeat", "1"],
            "simulated requests per second, Fig. 2 GSP cell (>= 5,000; issue 20: LBGR+RLT >= 40k, CA+LRU >= 60k, "
            "vs the simulator alone and Vidur's engine)"),
    "sim_artifact": ("bench_artifact_cell.py", [],
                     "one Fig. 2 GSP cell per protocol side by side (text: 1,024 requests; artifact: 4,096 of ~3.1k "
                     "tokens on SGLang 0.4.6's preset, LBGR+RLT as shipped): wall time and req/s"),
    "learner_flips": ("bench_learner_flips.py", ["--exp", "fig2_main", "--limit", "6"],
                      "LBGR decisions the learner's Cholesky solve flips vs the old numpy inverse (issue 20: 0)"),
    "costmodel": ("bench_costmodel.py", [], "step-cost model call cost"),
    "scaling": ("bench_scaling.py", ["--quick"], "64-worker GSP cell 1k..1M requests: wall, peak RSS, growth (issue 20: 1M <= 3 min, <= 4 GB; <= 4 KB/request)"),
    "workloads": ("bench_workloads.py", ["--repeat", "1"], "workload build vs cached load"),
    "tokenizer": ("bench_tokenizer.py", ["--limit", "20000"], "ShareGPT through Llama-3: encode_batch vs one by one"),
    "figures": ("bench_figures.py", ["--paper-only"],
                "`make figures` from scratch (issue 20: paper <= 60 s on 2 cores; beyond the paper <= 120 s more)"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller inputs, fewer repeats")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run these benchmarks only")
    args = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    status: list[tuple[str, str]] = []
    for name, (script, quick_args, what) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        python = sys.executable
        if name == "sglang":
            if not SGLANG_PYTHON.exists():
                status.append((name, "not run: build the CPU SGLang environment with `make sglang-env`"))
                continue
            python = str(SGLANG_PYTHON)
        print(f"\n===== {name}: {what}", flush=True)
        t0 = time.perf_counter()
        cmd = [python, str(ROOT / "tests" / "benchmarks" / script), *(quick_args if args.quick else [])]
        rc = subprocess.call(cmd, cwd=ROOT, env=env)
        status.append((name, f"{'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.perf_counter() - t0:.0f} s"))
    print("\n===== summary")
    for name, line in status:
        print(f"  {name:<10} {line}")
    return 0 if all(not line.startswith("FAILED") for _, line in status) else 1


if __name__ == "__main__":
    sys.exit(main())
