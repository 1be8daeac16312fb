"""The LBGR design study: policy variants against a baseline on the protocol's cell sets.

    python -m repro.analysis.lbgr_diagnostics sweep tuning|evaluation \\
        --variant 'LBGR+LRU=policy=lbgr_lru router.decay_factor=0.95' [--variant ...] [--per-cell]

(scripts/lbgr_ablation.sh runs the study of REPRODUCE.md "LBGR reconstruction".) Constants are
chosen on TUNING cells only, then checked on the EVALUATION cells (fig2 / fig5 settings, seeds
0-2), which were never used to pick a value. UltraChat is in no tuning cell.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from repro.analysis.cells import cached_run

TUNING_SEEDS = (100, 101, 102)
TUNING_CELLS = tuple(
    [
        ("workload=gsp", f"cluster.kv_cache_tokens={c}", f"workload.request_rate={r}")
        for c in (16384, 32768)
        for r in (8.0, 12.0, 16.0, 20.0)
    ]
    + [
        ("workload=sharegpt", f"cluster.kv_cache_tokens={c}", f"workload.request_rate={r}")
        for c in (20480, 40960)
        for r in (8.0, 12.0, 16.0, 20.0)
    ]
    + [("workload=loogle", "workload.request_rate=12.0")]
    + [
        ("workload=gsp", "cluster.kv_cache_tokens=32768", "workload.request_rate=12.0", f"workload.output_len={o}")
        for o in (32, 128)
    ]  # the decode-heavy regime of fig12
)
EVALUATION_SEEDS = (0, 1, 2)
EVALUATION_CELLS = tuple(
    [
        (f"workload={w}", f"cluster.kv_cache_tokens=${{limited_kv_cache_tokens.{w}}}", "workload.request_rate=12.0")
        for w in ("gsp", "sharegpt", "ultrachat", "loogle")
    ]  # fig2
    + [
        ("workload=gsp", "cluster.kv_cache_tokens=${limited_kv_cache_tokens.gsp}", f"workload.request_rate={r}")
        for r in (4.0, 8.0, 16.0, 20.0)
    ]  # fig5 (its 12 req/s cell is fig2's GSP cell)
)
CELL_SETS = {"tuning": (TUNING_CELLS, TUNING_SEEDS), "evaluation": (EVALUATION_CELLS, EVALUATION_SEEDS)}


def _run_summary(args: tuple[tuple[str, ...], str]) -> tuple[tuple[str, ...], dict]:
    overrides, cache_dir = args

    def compute(cfg) -> dict:
        from repro.backends.sim import run_cell
        from repro.metrics.summary import summarize

        summary = summarize(run_cell(cfg).records)
        summary.pop("provenance", None)
        return {"overrides": list(overrides), "summary": summary}

    return overrides, cached_run(overrides, cache_dir, compute)["summary"]


def sweep(cell_set: str, policies: dict[str, Sequence[str]], cache_dir: Path, n_jobs: int = 2) -> pd.DataFrame:
    """Summaries of every (cell, seed, policy variant) of `cell_set`; `policies`: label -> overrides.

    Results are cached per run signature in `cache_dir` (a rerun only computes what is new; a
    changed default changes the signature).
    """
    from multiprocessing import get_context

    cells, seeds = CELL_SETS[cell_set]
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs, meta = [], []
    for cell in cells:
        for seed in seeds:
            for label, pol in policies.items():
                ov = tuple(pol) + tuple(cell) + (f"seed={seed}", "tracking=disabled")
                jobs.append((ov, str(cache_dir)))
                vals = [c.split("=", 1)[1] for c in cell]
                meta.append(
                    {
                        "cell": " ".join("limited" if v.startswith("${") else v for v in vals),
                        "seed": seed,
                        "policy": label,
                    }
                )
    if n_jobs > 1:
        with get_context("spawn").Pool(n_jobs) as pool:
            out = pool.map(_run_summary, jobs, chunksize=1)
    else:
        out = [_run_summary(j) for j in jobs]
    rows = [{**m, **s} for m, (_, s) in zip(meta, out)]
    return pd.DataFrame(rows)


def compare(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per policy: geometric-mean ratios to `baseline` over (cell, seed) of P50/P95 latency and TTFT,
    throughput, and the mean hit-rate difference; `score` = geomean of sqrt(P50 * P95 latency ratio)
    (the tuning objective: lower is better), `worst` = its largest per-cell value."""
    key = ["cell", "seed"]
    base = df[df.policy == baseline].set_index(key)
    rows = []
    for pol, g in df.groupby("policy", sort=False):
        g = g.set_index(key)
        b = base.loc[g.index]
        r = {"policy": pol}
        for m in ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s", "throughput_rps"):
            r[m] = float(np.exp(np.mean(np.log(g[m] / b[m]))))
        r["hit_diff"] = float(np.mean(g.hit_rate - b.hit_rate))
        per = np.sqrt(g.latency_p50_s / b.latency_p50_s * g.latency_p95_s / b.latency_p95_s)
        r["score"] = float(np.exp(np.mean(np.log(per))))
        r["worst"] = float(per.max())
        r["worst_cell"] = " ".join(map(str, per.idxmax()))
        rows.append(r)
    return pd.DataFrame(rows).set_index("policy")


def markdown_table(df: pd.DataFrame) -> str:
    """Per cell and policy, the mean over seeds of hit rate, P50/P95 latency and TTFT, throughput."""
    cols = {
        "hit_rate": "hit",
        "latency_p50_s": "P50 lat (s)",
        "latency_p95_s": "P95 lat (s)",
        "ttft_p50_s": "P50 TTFT (s)",
        "ttft_p95_s": "P95 TTFT (s)",
        "throughput_rps": "tput (req/s)",
    }
    g = df.groupby(["cell", "policy"], sort=False)[list(cols)].mean()
    lines = ["| cell | system | " + " | ".join(cols.values()) + " |", "|" + "---|" * (len(cols) + 2)]
    for (cell, pol), row in g.iterrows():
        vals = [f"{row[c]:.3f}" if c == "hit_rate" else f"{row[c]:.3g}" for c in cols]
        lines.append(f"| {cell} | {pol} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def sweep_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="lbgr_diagnostics sweep", description="protocol sweep: ratios to a baseline")
    ap.add_argument("cell_set", choices=sorted(CELL_SETS))
    ap.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="LABEL=OVERRIDES",
        help="a policy variant: label=space-separated Hydra overrides (repeatable; no '=' in the label)",
    )
    ap.add_argument("--baseline", default="CacheAware+LRU=policy=cache_aware_lru", metavar="LABEL=OVERRIDES")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/lbgr_sweep"))
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--per-cell", action="store_true", help="also print every cell's P50/P95/hit")
    ap.add_argument("--markdown", action="store_true", help="also print per-cell means over seeds as Markdown")
    args = ap.parse_args(argv)
    policies = {}
    for spec in [args.baseline, *args.variant]:
        label, _, ov = spec.partition("=")
        policies[label] = ov.split()
    df = sweep(args.cell_set, policies, args.cache_dir, args.n_jobs)
    base = args.baseline.partition("=")[0]
    pd.set_option("display.width", 200)
    if args.per_cell:
        piv = df.pivot_table(
            index=["cell", "seed"], columns="policy", values=["latency_p50_s", "latency_p95_s", "hit_rate"], sort=False
        )
        print(piv.round(3).to_string())
    if args.markdown:
        print(markdown_table(df))
    print(compare(df, base).round(3).to_string())
    return 0
