"""LBGR diagnostics, the command line: one cell with every routing decision recorded, the design
study (`sweep`), the tuning protocol (`tune`) and the high-load diagnostic (`highload`).

    python -m repro.analysis.lbgr_diagnostics policy=lbgr_lru cluster.kv_cache_tokens=16384 \\
        workload.request_rate=20 [--out /tmp/diag] [--quiet]
    python -m repro.analysis.lbgr_diagnostics sweep tuning|evaluation \\
        --variant 'LBGR+LRU=policy=lbgr_lru router.decay_factor=0.95' [--variant ...] [--per-cell]
    python -m repro.analysis.lbgr_diagnostics highload [--rates 8,16,24,32] ...   (lbgr_highload.py)
    python -m repro.analysis.lbgr_diagnostics tune [--param router.decay_factor=0.8,0.9,0.95 ...]
        [--design oat|factorial] [--quick]     (the tuning protocol: scripts/lbgr_tune.sh)

What is recorded: repro/analysis/decisions.py; the study: lbgr_sweep.py; the protocol: lbgr_tune.py;
LBGR's predictions against the realised latency parts on regime_map cells: lbgr_highload.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from repro.analysis.cells import compose_cell
from repro.analysis.decisions import run_instrumented, summarise_decisions
from repro.analysis.lbgr_highload import highload_main
from repro.analysis.lbgr_sweep import sweep_main
from repro.analysis.lbgr_tune import tune_main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        return sweep_main(argv[1:])
    if argv[:1] == ["tune"]:
        return tune_main(argv[1:])
    if argv[:1] == ["highload"]:
        return highload_main(argv[1:])
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the cell (policy=lbgr_lru seed=100 ...)")
    ap.add_argument("--out", type=Path, help="write decisions.parquet, thetas.parquet, diagnostics.json here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    cfg = compose_cell(args.overrides)
    summary, rec = run_instrumented(cfg)
    d = rec.decision_table()
    diag = summarise_decisions(d, int(cfg.cluster.num_workers))
    result = {"overrides": list(args.overrides), "summary": summary, "diagnostics": diag}
    th = rec.theta_table()
    if len(th):
        last = th.groupby("worker").tail(1).set_index("worker")
        result["theta_final"] = {
            int(w): [round(float(v), 4) for v in row] for w, row in last.filter(like="theta").iterrows()
        }
        half = th[th["now_s"] >= th["now_s"].median()]
        result["theta_second_half_mean"] = {
            int(w): [round(float(v), 4) for v in g.filter(like="theta").mean()] for w, g in half.groupby("worker")
        }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        d.to_parquet(args.out / "decisions.parquet")
        if len(th):
            th.to_parquet(args.out / "thetas.parquet")
        (args.out / "diagnostics.json").write_text(json.dumps(result, indent=1, default=float))
    if not args.quiet:
        json.dump(result, sys.stdout, indent=1, default=float)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
