"""The competitive-ratio experiment: grid of theory cells -> results/thm_competitive_ratio/.

    python -m repro.theory.competitive_ratio [--results-dir results] [--quick]

Grid: x = 4, 8, ..., 1024 (log-spaced) for L-LRU, RLT and OPT on the Theorem 4 construction
(x = B - L + 1, L = 8) and the Theorem 5 construction (x = B - L - beta + 2, L = 2, beta = 4,
which keeps the paper's assumption beta * L <= B down to x = 4); token granularity, the
replayer's single-worker model. Each cell is stored through repro.results.CellStore under
results/thm_competitive_ratio/<run_signature(params)>/ (config.yaml, timings.json, then
summary.json last); finished cells are skipped on rerun. `--quick` runs a 3-point grid with
few phases and seeds (seconds; for tests). The figure is rendered from results/ only, by the
layer above: `python -m repro.figures thm_competitive_ratio` (theory never imports figures).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import yaml

from repro.results import CellStore, run_signature
from repro.results.fingerprint import PYTHON_VERSION
from repro.theory.experiment import run_theory_cell

EXP = "thm_competitive_ratio"
FULL_X = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
QUICK_X = (4, 16, 64)
THM4_L = 8
THM5_L, THM5_BETA = 2, 4


def grid(quick: bool = False) -> list[dict]:
    xs = QUICK_X if quick else FULL_X
    num_phases = 5 if quick else 20
    rlt_seeds = 4 if quick else 32
    cells = []
    for x in xs:
        for pol in ("lru", "rlt", "opt"):
            common = {
                "policy": pol,
                "granularity": "token",
                "num_phases": num_phases,
                "num_seeds": rlt_seeds if pol == "rlt" else 1,
            }
            # one base seed per (panel, x): the same seeds everywhere would correlate RLT's
            # errors across x, and map its draws one-to-one onto both constructions (their
            # candidate sets are isomorphic)
            cells.append(
                {"construction": "thm4", "b_minus_l_plus_1": x, "min_path_len": THM4_L, "beta": 1, "seed": x, **common}
            )
            cells.append(
                {
                    "construction": "thm5",
                    "b_minus_l_minus_beta_plus_2": x,
                    "min_path_len": THM5_L,
                    "beta": THM5_BETA,
                    "seed": 100_000 + x,
                    **common,
                }
            )
    return cells


def run_cell_stored(params: dict, results_dir: str) -> tuple[dict, bool]:
    """Run (or skip, if finished) one cell; returns (summary, ran)."""
    sig = run_signature(params)
    store = CellStore(results_dir, EXP, sig)
    if store.is_finished() and store.integrity()[0] != "damaged":
        return store.read_summary(), False
    result = run_theory_cell(params)
    timings = result.pop("timings")
    store.write_text(CellStore.CONFIG, yaml.safe_dump(params, sort_keys=True))
    store.write_json(CellStore.TIMINGS, timings)
    summary = {
        **result,
        "params": params,
        "provenance": {
            "code": "repro.theory.competitive_ratio",
            "model": "single worker, replayer",
            "python": PYTHON_VERSION,
            "numpy": np.__version__,
            "signature": sig,
        },
    }
    store.finish(summary)  # checksum manifest, then summary.json last: marks the cell finished
    return summary, True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.theory.competitive_ratio", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--quick", action="store_true", help="3-point grid, few phases/seeds (seconds)")
    args = ap.parse_args(argv)
    cells = grid(args.quick)
    c0, t0 = time.process_time(), time.perf_counter()
    ran = 0
    print(f"{'construction':12} {'policy':6} {'x':>5} {'misses/phase':>12} {'95% CI':>19} {'H_x':>7}")
    for params in cells:
        s, did = run_cell_stored(params, args.results_dir)
        ran += did
        ci = f"[{s['ci95_low']:.3f}, {s['ci95_high']:.3f}]"
        print(
            f"{s['construction']:12} {s['policy']:6} {s['x']:>5} {s['misses_per_phase']:>12.3f} {ci:>19} "
            f"{s['harmonic']:>7.3f}{'' if did else '  (cached)'}"
        )
    cpu = time.process_time() - c0
    print(
        f"{ran} cells run, {len(cells) - ran} skipped as finished; CPU {cpu:.1f} s, wall {time.perf_counter() - t0:.1f} s"
    )
    print(f"render the figure: python -m repro.figures thm_competitive_ratio --results-dir {args.results_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
