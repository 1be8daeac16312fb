"""One Fig. 2 GSP cell per protocol, side by side: wall time and simulated req/s.

protocol=text: today's GSP (1,024 requests, conf/exp/shared/paper.yaml's cluster), LBGR+RLT.
protocol=artifact: the authors' GSP (4,096 requests of ~3.1k tokens, SGLang 0.4.6's preset:
~200k KV tokens per worker, fcfs, up to 2,049 running), LBGR and RLT as shipped. Each cell runs
through the sim backend's `run_cell` as `python -m repro.run +exp=fig2_main` runs it (tracking
off); its workload pool is built (or loaded from the disk cache) first and timed apart.

    PYTHONPATH=. python tests/benchmarks/bench_artifact_cell.py [--repeat 1] [--systems lbgr_rlt ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from repro.analysis.cells import compose_cell  # noqa: E402
from repro.backends import assembly  # noqa: E402
from repro.backends.sim import run_cell  # noqa: E402
from repro.confutil import to_plain  # noqa: E402


def cell_config(protocol: str, system: str, seed: int):
    cfg = compose_cell(["exp=fig2_main", f"protocol={protocol}", "workload=gsp", f"seed={seed}", "tracking=disabled"])
    policy = to_plain(cfg)["protocol"]["systems"][system]
    return to_plain(
        compose_cell(
            [
                "exp=fig2_main",
                f"protocol={protocol}",
                "workload=gsp",
                f"seed={seed}",
                "tracking=disabled",
                f"policy={policy}",
            ]
        )
    ), policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--systems",
        nargs="+",
        default=["lbgr_rlt"],
        help="paper system options (protocol.systems keys), e.g. lbgr_rlt cache_aware_lru",
    )
    args = ap.parse_args()
    rows = []
    for system in args.systems:
        for protocol in ("text", "artifact"):
            cfg, policy = cell_config(protocol, system, args.seed)
            t0 = time.perf_counter()
            wl = assembly.build_workload(cfg, assembly.SeedPlan.spawn(cfg["seed"], 1))
            pool_s = time.perf_counter() - t0
            n = len(wl.requests)
            best = None
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                res = run_cell(cfg)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                best = min(best or (wall, cpu), (wall, cpu))
            done = len(res.records["finish_s"])
            rows.append((protocol, policy, n, done, pool_s, wl.cache_hit, *best))
            print(
                f"  {protocol:<9} {policy:<26} {n:>5} requests: cell {best[0]:.1f} s wall ({best[1]:.1f} s CPU), "
                f"{done / best[0]:,.0f} req/s; workload {'loaded' if wl.cache_hit else 'built'} in {pool_s:.1f} s",
                flush=True,
            )
    print(f"\n  {'protocol':<9} {'policy':<26} {'requests':>8} {'wall s':>8} {'CPU s':>8} {'req/s':>8} {'pool s':>8}")
    for protocol, policy, n, done, pool_s, hit, wall, cpu in rows:
        print(
            f"  {protocol:<9} {policy:<26} {n:>8} {wall:>8.1f} {cpu:>8.1f} {done / wall:>8,.0f} "
            f"{pool_s:>7.1f}{'' if hit else '*'}"
        )
    print("  (* pool built in this run, not loaded from the workload cache)")


if __name__ == "__main__":
    main()
