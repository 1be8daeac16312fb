"""Scaling: wall time and peak memory of a 64-worker GSP cell from 1k to 1M requests.

Cell (issue 20): 64 workers, Llama-3.1-8B on L40 (KV capacity from the memory formula), GSP
(conf/workload/gsp.yaml: 1024-3072-token system prompts, 128-token questions, 4 output
tokens) with min(1024, N / 16) groups of ceil(N / groups) prompts -- Fig. 2's 64 groups x
16 prompts at 1k, 64 workers' worth of Fig. 2's groups (1024) from 16k on -- random order, Poisson arrivals at 192 req/s (Fig. 2's 3
req/s per worker times 64: the workers keep up, queues stay bounded; the table prints the
drain time after the last arrival to show it). Systems: CacheAware+LRU (matching on text,
as the real router) and LBGR+RLT.

Every (size, system) runs in a fresh subprocess that composes the cell with Hydra (conf/, the
overrides below), builds it through repro.backends.assembly (workload from a fresh, empty
workload disk cache, so generation and the cache write are counted) and runs
repro.sim.cluster.SimCluster, as repro.backends.sim.run_cell does (results are not written).
The child reports its peak RSS (getrusage(RUSAGE_SELF).ru_maxrss) after each phase; the
parent times the whole subprocess, start-up and imports included.

Printed: wall time and peak RSS per size, the growth exponents (log-log slope of wall time
and of RSS above the smallest size's), the issue's targets for the 1M cell (<= 3 min,
<= 4 GB) with ratios, and memory per request = (peak RSS at N - peak RSS at N/16) / (15 N / 16)
at the largest N (target <= 4 KB), for the whole cell and for the workload alone.

    PYTHONPATH=. python tests/benchmarks/bench_scaling.py [--quick] [--sizes 1000 16000 ...] [--systems ca lbgr]

--quick: sizes 1k / 4k / 16k / 64k. The full run (1k / 16k / 256k / 1M, and 62.5k for the
per-request measure) needed ~22 GB at 1M when written (the simulator's request table kept
each prompt's ids and key, ~18 KB per request); the parent refuses a size whose memory,
extrapolated from the sizes run before it, would not fit in 80 % of the memory available
now, and prints the linear extrapolation to 1M instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 64
RATE = 192.0  # req/s: 3 per worker, Fig. 2's load
MAX_GROUPS = 1024
SYSTEMS = {"ca": "cache_aware_lru", "lbgr": "lbgr_rlt"}
SIZES = [1_000, 16_000, 256_000, 1_000_000]
QUICK = [1_000, 4_000, 16_000, 64_000]
TARGET_WALL_S, TARGET_RSS_GB, TARGET_PER_REQ_KB = 180.0, 4.0, 4.0


def overrides(n: int, system: str) -> list[str]:
    groups = max(1, min(MAX_GROUPS, n // 16))
    return [
        "workload=gsp", f"policy={SYSTEMS[system]}", f"cluster.num_workers={WORKERS}",
        f"workload.num_queries={n}", f"workload.num_groups={groups}", "workload.prompts_per_group=null",
        f"workload.request_rate={RATE}", "tracking=disabled", "seed=0",
    ]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def child(n: int, system: str) -> None:
    """One cell in this process; prints a JSON line with the phases' wall time and peak RSS."""
    t0 = time.perf_counter()
    phases = {}

    def mark(name: str) -> None:
        phases[name] = {"t_s": time.perf_counter() - t0, "rss_mb": _rss_mb()}

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import repro.harness.schema  # noqa: F401  (registers the structured schema)
    from repro.backends import assembly
    from repro.harness.compose import resolve
    from repro.sim.cluster import SimCluster

    mark("imports")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.create(resolve(compose("config", overrides=overrides(n, system))))
    mark("compose")
    cell = assembly.assemble(cfg, components=False)
    mark("workload")
    plan = cell.plan
    cell.cost_model = assembly.build_cost_model(cfg)
    cell.caches = assembly.build_caches(cfg, plan.capacities, plan.seeds)
    cell.router = assembly.build_router(cfg["router"])
    sim = SimCluster(cell.requests, cell.caches, cell.cost_model, cell.router, plan.scheduler,
                     plan.eviction_name, plan.seeds.router)
    mark("sim_built")
    c0 = time.process_time()
    res = sim.run()
    sim_cpu = time.process_time() - c0
    mark("sim_run")
    rec = res.records
    lat = (rec["finish_s"] - rec["arrival_s"]).to_numpy()
    out = {
        "n": len(cell.requests), "system": system, "phases": phases, "sim_cpu_s": sim_cpu,
        "hit_rate": float(rec["cached_tokens"].sum() / rec["prompt_tokens"].sum()),
        "last_arrival_s": float(rec["arrival_s"].max()),
        "drain_s": float(rec["finish_s"].max() - rec["arrival_s"].max()),
        "latency_p50_s": float(sorted(lat)[len(lat) // 2]),
        "latency_max_s": float(lat.max()),
        "cache_hit": bool(cell.workload.cache_hit),
    }
    print("RESULT " + json.dumps(out), flush=True)


def run_child(n: int, system: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as cache:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_CACHE_DIR": cache}
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, __file__, "--child", str(n), system], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise RuntimeError(f"{system} at {n}: over {timeout_s:.0f} s")
        wall = time.perf_counter() - t0
        # communicate() has reaped the child: its rusage is in RUSAGE_CHILDREN's running max only,
        # so take the peak from the child's own report (the same number getrusage(SELF) gives at exit)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"{system} at {n}: exit {p.returncode}\n{stderr[-3000:]}")
        out = json.loads(lines[-1][len("RESULT "):])
        out["wall_s"] = wall
        out["peak_rss_mb"] = max(ph["rss_mb"] for ph in out["phases"].values())
        return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float("nan")


def available_mb() -> float:
    with open("/proc/meminfo") as f:
        info = {ln.split(":")[0]: float(ln.split()[1]) for ln in f}
    return info.get("MemAvailable", 0.0) / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK}")
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS), default=["ca", "lbgr"])
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per cell")
    ap.add_argument("--child", nargs=2, metavar=("N", "SYSTEM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1])
        return 0
    sizes = sorted(args.sizes or (QUICK if args.quick else SIZES))
    big = sizes[-1]
    small = max(1, big // 16)  # the per-request measure's N / 16
    runs = sorted(set(sizes) | {small})
    print(f"GSP, {WORKERS} workers, {RATE:g} req/s, min({MAX_GROUPS}, N/16) groups; sizes {runs}; "
          f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, {available_mb() / 1024:.1f} GB available")
    results: dict[str, dict[int, dict]] = {}
    for system in args.systems:
        results[system] = {}
        print(f"\n== {SYSTEMS[system]}")
        print(f"  {'N':>9} {'wall s':>8} {'sim CPU s':>9} {'req/s':>8} {'peak MB':>8} {'workload MB':>11} "
              f"{'hit':>6} {'drain s':>8} {'p50 s':>7}  load")
        for n in runs:
            done = sorted(results[system])
            if len(done) >= 2:  # refuse a size that would not fit (linear in N above the smallest)
                a, b = results[system][done[0]], results[system][done[-1]]
                per = (b["peak_rss_mb"] - a["peak_rss_mb"]) / max(b["n"] - a["n"], 1)
                need = b["peak_rss_mb"] + per * (n - b["n"])
                if need > 0.8 * available_mb():
                    print(f"  {n:>9} not run: needs ~{need / 1024:.1f} GB by the sizes before it, "
                          f"{available_mb() / 1024:.1f} GB available")
                    continue
            load = os.getloadavg()[0]
            r = run_child(n, system, args.timeout)
            results[system][n] = r
            wl = r["phases"]["workload"]["rss_mb"]
            print(f"  {r['n']:>9,} {r['wall_s']:>8.1f} {r['sim_cpu_s']:>9.1f} {r['n'] / r['wall_s']:>8,.0f} "
                  f"{r['peak_rss_mb']:>8,.0f} {wl:>11,.0f} {r['hit_rate']:>6.3f} {r['drain_s']:>8.2f} "
                  f"{r['latency_p50_s']:>7.3f}  {load:.2f}", flush=True)
            ph = r["phases"]
            print("            phases (end s / peak MB): " + ", ".join(
                f"{k} {v['t_s']:.1f}/{v['rss_mb']:,.0f}" for k, v in ph.items()), flush=True)
    summary(results, sizes)
    return 0


def summary(results: dict, sizes: list[int]) -> None:
    print(f"\nissue 20 -- scaling (load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
    for system, by_n in results.items():
        name = SYSTEMS[system]
        ns = [n for n in sizes if n in by_n]
        if len(ns) >= 2:
            walls = [by_n[n]["wall_s"] for n in ns]
            line = (f"  {name}: wall-time exponent {slope(ns, walls):.2f} over {ns} "
                    f"(top two sizes {slope(ns[-2:], walls[-2:]):.2f})")
            grow = [(n, by_n[n]["peak_rss_mb"] - by_n[ns[0]]["peak_rss_mb"]) for n in ns[1:]]
            if len(grow) >= 2:
                line += f"; exponent of the RSS above {ns[0]:,}'s: {slope(*zip(*grow)):.2f}"
            print(line)
        # per request: at the largest N run whose N / 16 ran too
        pairs = [n for n in sorted(by_n) if n >= 16 and n // 16 in by_n]
        if pairs:
            a, b = by_n[pairs[-1] // 16], by_n[pairs[-1]]
            d = b["n"] - a["n"]
            per_cell = (b["peak_rss_mb"] - a["peak_rss_mb"]) * 1024 / d
            per_wl = (b["phases"]["workload"]["rss_mb"] - a["phases"]["workload"]["rss_mb"]) * 1024 / d
            print(f"  {name}: per request (peak RSS at {b['n']:,} - at {a['n']:,}) / (N - N/16): "
                  f"cell {per_cell:.2f} KB ({per_cell / TARGET_PER_REQ_KB:.2f} x target {TARGET_PER_REQ_KB:g} KB), "
                  f"workload alone {per_wl:.2f} KB ({per_wl / TARGET_PER_REQ_KB:.2f} x)")
        if not by_n:
            continue
        top = max(by_n)
        r = by_n[top]
        tag = "1M cell" if top >= 1_000_000 else f"largest run {top:,} (not the 1M target size)"
        print(f"  {name}: {tag}: wall {r['wall_s']:.1f} s = {r['wall_s'] / TARGET_WALL_S:.2f} x "
              f"target {TARGET_WALL_S:.0f} s; peak RSS {r['peak_rss_mb'] / 1024:.2f} GB = "
              f"{r['peak_rss_mb'] / 1024 / TARGET_RSS_GB:.2f} x target {TARGET_RSS_GB:g} GB")
        done = sorted(by_n)
        if top < 1_000_000 and len(done) >= 2:  # linear from the two largest sizes run
            p, q = by_n[done[-2]], by_n[done[-1]]
            f = (1_000_000 - q["n"]) / (q["n"] - p["n"])
            wall = q["wall_s"] + f * (q["wall_s"] - p["wall_s"])
            rss = (q["peak_rss_mb"] + f * (q["peak_rss_mb"] - p["peak_rss_mb"])) / 1024
            print(f"  {name}: 1M extrapolated linearly from {p['n']:,} and {q['n']:,}: wall ~{wall:.0f} s "
                  f"({wall / TARGET_WALL_S:.2f} x target), peak RSS ~{rss:.1f} GB ({rss / TARGET_RSS_GB:.2f} x target)")


if __name__ == "__main__":
    sys.exit(main())
