"""LBGR decisions the learner's plain-float solve flips, on the paper's LBGR cells (issue 20).

RidgeRLSLearner solves its 4 x 4 systems by a plain-Python Cholesky factorisation; until issue 20
it inverted them with numpy (LAPACK getrf / getri). The two agree to ~1e-15 relative, not bit for
bit. This runs each LBGR cell of the chosen experiments exactly as the harness does
(repro.backends.sim.run_cell, same grid, same seeds) and shadows the router's learner with the
old one (tests/routing/ridge_reference.py) fed the very same samples; before every decision it
takes the argmin of E with each learner's theta. A decision where the two differ is a flip.

Every decision of the run is checked against the SAME history, so the count is exact: with 0
flips the old and the new code make the same decisions, hence the same requests and metrics
(the rest of LBGR is bit-identical); with k > 0 the cells listed differ and the lead
regenerates. Also printed: the largest relative theta difference seen and the smallest relative
gap between the best and the runner-up E (how near a tie came to flipping). Nothing is written
under results/ (the summary goes to --out, default /tmp/learner_flips.json).

    PYTHONPATH=. python tests/benchmarks/bench_learner_flips.py                 # fig2, fig5, fig6, tab2, fig14
    PYTHONPATH=. python tests/benchmarks/bench_learner_flips.py --exp fig2_main --limit 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from repro.routing import LBGRRouter  # noqa: E402
from repro.routing.learners import RidgeRLSLearner  # noqa: E402
from repro.routing.base import Router  # noqa: E402
from tests.routing.ridge_reference import InverseEveryUpdate  # noqa: E402

EXPERIMENTS = ("fig2_main", "fig5_request_rate", "fig6_workers", "tab2_ablation", "fig14_decay_interval")


class _Rows:
    """A stand-in learner that offers the reference theta to LBGR's evaluation."""

    def __init__(self, ref: InverseEveryUpdate) -> None:
        self.ref = ref

    @property
    def theta_rows(self):
        return self.ref.theta.tolist()

    @property
    def theta(self):
        return self.ref.theta

    @property
    def version(self):
        return ("ref", self.ref.version)


def _argmin(predicted, loads) -> int:
    """LBGR's rule: argmin E, ties -> lower load, then lower id."""
    w = 0
    for i in range(1, len(predicted)):
        if predicted[i] < predicted[w] or (predicted[i] == predicted[w] and loads[i] < loads[w]):
            w = i
    return w


class ShadowRouter(Router):
    """Routes with the wrapped LBGRRouter; shadows its learner with the pre-issue-20 one."""

    def __init__(self, inner: LBGRRouter) -> None:
        self.inner = inner
        self.name = inner.name
        self.decisions = self.flips = 0
        self.flip_at: list[int] = []
        self.max_theta_rel = 0.0
        self.min_gap_rel = math.inf

    def reset(self, workers, seed):
        self.inner.reset(workers, seed)
        lr = self.inner.learner
        if not isinstance(lr, RidgeRLSLearner):
            raise TypeError(f"the cell's LBGR has no ridge learner ({type(lr).__name__})")
        self.ref = InverseEveryUpdate(lr.num_workers, 4, lr.lam, lr.delta, lr.pooled, lr.pool_delta)
        self.ref_view = _Rows(self.ref)

    def select_worker(self, request, workers, now_s):
        r = self.inner
        loads = r.load_est.tolist()
        _, _, _, new_e = r._evaluate(request, workers, now_s)  # applies the decay (idempotent at now_s)
        learner, r.learner = r.learner, self.ref_view
        try:
            _, _, _, ref_e = r._evaluate(request, workers, now_s)
        finally:
            r.learner = learner
        mine, theirs = _argmin(new_e, loads), _argmin(ref_e, loads)
        choice = r.select_worker(request, workers, now_s)
        if choice != mine:
            raise AssertionError(f"the shadow's argmin {mine} is not LBGR's choice {choice}")
        self.decisions += 1
        if mine != theirs:
            self.flips += 1
            self.flip_at.append(self.decisions)
        if len(new_e) > 1:
            srt = sorted(new_e)
            gap = (srt[1] - srt[0]) / max(abs(srt[0]), 1e-12)
            if gap > 0:
                self.min_gap_rel = min(self.min_gap_rel, gap)
        return choice

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        record = self.inner.pending.get(request.id)
        self.inner.on_request_complete(request, worker_id, latency_s, ttft_s, cached_tokens, now_s)
        if record is not None:
            worker, phi, base = record[0], record[1], record[2]
            self.ref.update(worker, np.array(phi), float(latency_s) - base)
            new, old = np.asarray(self.inner.learner.theta), self.ref.theta
            scale = max(float(np.abs(old).max()), 1e-3)
            self.max_theta_rel = max(self.max_theta_rel, float(np.abs(new - old).max()) / scale)

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.inner.on_request_abandoned(request, worker_id, now_s)


def lbgr_cells(exp: str):
    """The cells of `exp` whose router is LBGR: [(label, resolved config)], the harness's grid."""
    from hydra import compose

    from repro.harness.compose import GridComposer, compose_cells
    from repro.harness.grid import expand_grid
    from omegaconf import OmegaConf

    ovs = [f"exp={exp}"]
    with_hydra = compose(config_name="config", overrides=ovs, return_hydra_config=True)
    sp = with_hydra.hydra.sweeper.get("params")
    cells = expand_grid(OmegaConf.to_container(sp) if sp is not None else None, ovs)
    compose_cells(cells, GridComposer("config"))
    return [(c.label, c.config) for c in cells if (c.config.get("router") or {}).get("name") == "lbgr"
            and (c.config.get("backend") or {}).get("name", "sim") == "sim"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exp", nargs="+", default=list(EXPERIMENTS))
    ap.add_argument("--limit", type=int, default=None, help="at most this many LBGR cells per experiment")
    ap.add_argument("--out", default="/tmp/learner_flips.json")
    args = ap.parse_args()

    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    import repro.harness.schema  # noqa: F401  (registers the structured schema before composition)
    from repro.backends.sim import run_cell
    from repro.confutil import CONF_DIR

    rows = []
    t0 = time.perf_counter()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for exp in args.exp:
            cells = lbgr_cells(exp)[: args.limit]
            for label, cfg in cells:
                shadows: list[ShadowRouter] = []

                def wrap(router):
                    shadows.append(ShadowRouter(router))
                    return shadows[-1]

                c0 = time.perf_counter()
                run_cell(OmegaConf.create(cfg), wrap_router=wrap)
                s = shadows[0]
                rows.append({"exp": exp, "cell": label, "decisions": s.decisions, "flips": s.flips,
                             "flip_at": s.flip_at[:20], "max_theta_rel_diff": s.max_theta_rel,
                             "min_gap_rel": s.min_gap_rel, "seconds": time.perf_counter() - c0})
                print(f"{exp:<22}{label:<60}{s.decisions:>7} decisions {s.flips:>4} flips  "
                      f"theta rel diff <= {s.max_theta_rel:.1e}  min rel E gap {s.min_gap_rel:.1e}", flush=True)
    total = sum(r["decisions"] for r in rows)
    flips = sum(r["flips"] for r in rows)
    flipped = [f"{r['exp']} [{r['cell']}]" for r in rows if r["flips"]]
    summary = {"cells": len(rows), "decisions": total, "flips": flips, "cells_with_flips": flipped,
               "max_theta_rel_diff": max((r["max_theta_rel_diff"] for r in rows), default=0.0),
               "min_gap_rel": min((r["min_gap_rel"] for r in rows), default=math.inf),
               "load_avg": os.getloadavg(), "seconds": time.perf_counter() - t0, "rows": rows}
    Path(args.out).write_text(json.dumps(summary, indent=1, default=float))
    print(f"\n{len(rows)} LBGR cells of {', '.join(args.exp)}: {total} decisions, {flips} flips "
          f"({len(flipped)} cells with a flip); largest relative theta difference {summary['max_theta_rel_diff']:.1e}; "
          f"smallest relative E gap {summary['min_gap_rel']:.1e}; {summary['seconds']:.0f} s; -> {args.out}")
    for c in flipped:
        print(f"  flipped: {c}")


if __name__ == "__main__":
    main()
