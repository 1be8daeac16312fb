"""LBGR's cost per request, this checkout against an earlier git revision, side by side in ONE process.

    PYTHONPATH=. python tests/benchmarks/bench_lbgr_ab.py --base <rev> [--repeat 7]

The base revision's LBGR modules (repro/routing/{lbgr,learners,trackers,service_time,
load_decay}.py, read with `git show`) are loaded as a separate package next to this checkout's;
everything below them (repro.kvcache, repro.routing.base, the cost model) is this checkout's,
so the difference is LBGR's own code. Measured, interleaved base / new, CPU time
(time.process_time), the minimum over --repeat rounds:

1. router calls on the Fig. 2 GSP bench cell (tests/benchmarks/bench_sim.py: 1024 requests,
   4 workers, LBGR+RLT): the cell is simulated once, its router calls (every select_worker and
   on_request_complete with their arguments) recorded, then replayed on a fresh router of each
   version: us per request, decision + completion. Both versions must make the recorded
   decisions (checked), so they do the same work.
2. the decision alone, p50 of select_worker at M = 4, 10, 64 with 4k-token prompts
   (tests/benchmarks/bench_routing.py's stream and views).
3. the ridge learner's update alone (M = 4, 10, 64).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

MODULES = ("learners", "load_decay", "service_time", "trackers", "lbgr")  # dependency order


def load_base(rev: str, name: str = "lbgr_base"):
    """The LBGR modules of git revision `rev` as package `name` (their imports of each other rewired)."""
    pkg = types.ModuleType(name)
    pkg.__path__ = []
    sys.modules[name] = pkg
    for mod in MODULES:
        src = subprocess.run(["git", "show", f"{rev}:repro/routing/{mod}.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        for other in MODULES:
            src = src.replace(f"from repro.routing.{other} import", f"from {name}.{other} import")
        spec = importlib.util.spec_from_loader(f"{name}.{mod}", loader=None)
        m = importlib.util.module_from_spec(spec)
        m.__file__ = f"<{rev}>/repro/routing/{mod}.py"
        sys.modules[f"{name}.{mod}"] = m
        exec(compile(src, m.__file__, "exec"), m.__dict__)
        setattr(pkg, mod, m)
    return pkg


class Recorder:
    """Wraps a router; records every call with its arguments (for replay)."""

    def __init__(self, inner, log):
        self.inner, self.log, self.name = inner, log, inner.name

    def reset(self, workers, seed):
        self.log.append(("reset", list(workers), seed))
        self.inner.reset(workers, seed)

    def select_worker(self, request, workers, now_s):
        w = self.inner.select_worker(request, workers, now_s)
        self.log.append(("select", request, now_s, w))
        return w

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.log.append(("complete", request, worker_id, latency_s, ttft_s, cached_tokens, now_s))
        self.inner.on_request_complete(request, worker_id, latency_s, ttft_s, cached_tokens, now_s)

    def __getattr__(self, key):
        return getattr(self.inner, key)


def record_cell():
    import bench_sim
    from repro.sim.cluster import SimCluster
    from repro.sim.worker import SchedulerConfig

    parts = bench_sim.build_parts(1024, 0, "lbgr", "rlt")
    log: list = []
    caches = [parts.make_cache(parts.capacity, s) for s in parts.plan.workers]
    SimCluster(parts.requests, caches, parts.cost, Recorder(parts.make_router(), log), SchedulerConfig(),
               parts.eviction, parts.plan.router).run()
    return log


def replay(router, log) -> tuple[float, list[int]]:
    _, workers, seed = log[0]
    router.reset(workers, seed)
    out = []
    gc.collect()
    gc.disable()
    c0 = time.process_time()
    for e in log[1:]:
        if e[0] == "select":
            out.append(router.select_worker(e[1], workers, e[2]))
        else:
            router.on_request_complete(*e[1:])
    cpu = time.process_time() - c0
    gc.enable()
    return cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with (e.g. main, a commit)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from omegaconf import OmegaConf

    import bench_routing
    from repro.costmodel import StepCostModel, kv_capacity_tokens
    from repro.routing import LBGRRouter
    from repro.routing import learners as new_learners

    base = load_base(args.base)
    versions = {"base": base.lbgr.LBGRRouter, "new": LBGRRouter}
    print(f"base = {args.base} ({subprocess.run(['git', 'rev-parse', '--short', args.base], cwd=ROOT, capture_output=True, text=True).stdout.strip()}), "
          f"new = this checkout; CPU time, min over {args.repeat} interleaved rounds; load {os.getloadavg()}")

    # 1. the bench cell's router calls
    log = record_cell()
    want = [e[3] for e in log if e[0] == "select"]
    best = {k: float("inf") for k in versions}
    for _ in range(args.repeat):
        for k, cls in versions.items():
            cpu, out = replay(cls(), log)
            if out != want:
                raise SystemExit(f"{k}: the replay's decisions differ from the recorded ones")
            best[k] = min(best[k], cpu)
    n = len(want)
    print(f"\n1. Fig. 2 GSP bench cell (1024 requests, 4 workers, LBGR+RLT): router calls, decision + completion")
    print(f"   base {best['base'] / n * 1e6:6.1f} us/request   new {best['new'] / n * 1e6:6.1f} us/request   "
          f"new / base {best['new'] / best['base']:.2f}   (router total {best['base']:.4f} s -> {best['new']:.4f} s)")

    # 2. decision p50
    model = OmegaConf.load(ROOT / "conf" / "model" / "llama31_8b.yaml")
    hw = OmegaConf.load(ROOT / "conf" / "hardware" / "l40.yaml")
    cost = StepCostModel.from_config(model, hw)
    cap = kv_capacity_tokens(model, hw, 0.9)
    warm, meas = 400, 300
    reqs = bench_routing.make_stream(4096, warm + meas)
    print(f"\n2. decision p50 (select_worker), 4k-token prompts, {args.repeat} rounds x {meas} decisions, p50 over all")
    for m in (4, 10, 64):
        us = {k: [] for k in versions}
        for _ in range(args.repeat):
            for k, cls in versions.items():
                us[k].append(bench_routing.measure(cls, reqs, m, cost, cap, warm))
        p = {k: float(np.percentile(np.concatenate(v), 50)) for k, v in us.items()}
        print(f"   M={m:<3} base {p['base']:6.1f} us   new {p['new']:6.1f} us   new / base {p['new'] / p['base']:.2f}")

    # 3. the learner's update
    print("\n3. RidgeRLSLearner.update (one completion's sample), us")
    rng = np.random.default_rng(0)
    for m in (4, 10, 64):
        samples = [(int(rng.integers(0, m)), (1.0, *rng.uniform(0, 4, 2).tolist(), float(rng.uniform(0, 3))),
                    float(rng.normal())) for _ in range(2000)]
        t = {}
        for k, mod in (("base", base.learners), ("new", new_learners)):
            best_k = float("inf")
            for _ in range(args.repeat):
                lr = mod.RidgeRLSLearner(m, 4, 0.99, 500.0, True, 3.0)
                c0 = time.process_time()
                for w, phi, y in samples:
                    lr.update(w, phi, y)
                best_k = min(best_k, time.process_time() - c0)
            t[k] = best_k / len(samples) * 1e6
        print(f"   M={m:<3} base {t['base']:6.2f}   new {t['new']:6.2f}   new / base {t['new'] / t['base']:.2f}")
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
