"""Workload load time: first build (parse + tokenise + write cache) vs a cached load.

    PYTHONPATH=. python tests/benchmarks/bench_workloads.py [--repeat 3] [workload ...]

Each workload's default config (conf/workload/<name>.yaml, seed 0) is built once into a
fresh cache directory, then loaded from the cache `--repeat` times (best time kept).
Prints seconds and the speed-up ratio, measured side by side in one run. The paper grid
needs hundreds of cached loads, so a cached load should stay well under a second.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from repro.workloads import build_workload  # noqa: E402

NAMES = ["gsp", "sharegpt", "ultrachat", "loogle"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=NAMES)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.environ["REPRO_CACHE_DIR"] = d
        print(f"{'workload':<10} {'requests':>8} {'source':>10} {'first build s':>14} {'cached load s':>14} {'ratio':>7}")
        for name in args.names:
            cfg = OmegaConf.load(ROOT / "conf" / "workload" / f"{name}.yaml")
            t0 = time.perf_counter()
            wl = build_workload(cfg, seed=0)
            first = time.perf_counter() - t0
            assert not wl.cache_hit
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                again = build_workload(cfg, seed=0)
                best = min(best, time.perf_counter() - t0)
                assert again.cache_hit
            print(f"{name:<10} {len(wl.requests):>8} {wl.provenance['source']:>10} {first:>14.3f} {best:>14.3f} "
                  f"{first / best:>6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
