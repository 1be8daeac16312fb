"""The LBGR tuning protocol: LBGR's free parameters chosen by prediction error on tuning cells.

    python -m repro.analysis.lbgr_diagnostics tune [--param router.decay_factor=0.8,0.9,0.95 ...]
        [--design oat|factorial] [--quick]     (scripts/lbgr_tune.sh)

LBGR's free parameters are chosen by what LBGR is: a latency predictor. `tune` runs every
candidate setting on the TUNE cells (seeds 100-102 only; never the figures' cells or seeds)
with the decisions recorded, and scores each setting by its prediction error: predicted E of
the chosen worker vs the realised end-to-end latency of that request. The ratio to the
baseline (Cache-Aware+LRU, same cells and seeds) is reported next to it, never used to choose.
Passed-over workers: the simulator cannot tell what a request would have taken on a worker it
was not sent to without forking the whole simulation at the decision, which the backend does
not offer; their error is not measured (the report says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from repro.analysis.cells import cached_run, compose_cell
from repro.analysis.decisions import fit_line, run_instrumented
from repro.analysis.lbgr_sweep import TUNING_SEEDS

TUNE_RATES = (4.0, 8.0, 12.0, 16.0, 20.0)
TUNE_CELLS = tuple(
    [
        (f"workload={w}", f"cluster.kv_cache_tokens={kv}", f"workload.request_rate={r}")
        for w, half in (("gsp", 16384), ("sharegpt", 20480), ("ultrachat", 32768))
        for kv in (half, f"${{limited_kv_cache_tokens.{w}}}")
        for r in TUNE_RATES
    ]  # half of / the limited budget
    + [("workload=loogle", f"workload.request_rate={r}") for r in TUNE_RATES]  # memory-formula budget
)
# --quick: each workload at its limited budget, at the lowest and the highest rate, the first tuning seed
QUICK_CELLS = tuple(
    c for c in TUNE_CELLS if c[-1].endswith(("=4.0", "=20.0")) and (c[0] == "workload=loogle" or "${" in c[1])
)
# Defaults grid of `scripts/lbgr_tune.sh`: one parameter at a time around conf/router/lbgr.yaml.
TUNE_PARAMS = {
    "router.decay_factor": ("0.5", "0.6", "0.7", "0.9"),
    "router.forgetting_factor": ("0.97", "0.99", "0.999"),
    "router.rls_regularization": ("50.0", "500.0", "5000.0"),
    "router.min_load_weight": ("null", "0.25", "0.5"),
    "router.output_len_prior": ("1.0", "16.0"),
}


def prediction_errors(d: pd.DataFrame) -> dict:
    """Prediction error of the chosen worker's E against the realised latency (one run)."""
    lat = d["latency_s"].to_numpy(dtype=float)
    e = d["predicted_s_chosen"].to_numpy(dtype=float)
    ok = np.isfinite(lat) & np.isfinite(e)
    lat, e = lat[ok], e[ok]
    if not len(lat):
        return {"n": 0}
    err = lat - e
    return {
        "n": int(len(lat)),
        "latency_sum_s": float(lat.sum()),
        "abs_err_sum_s": float(np.abs(err).sum()),
        "err_sum_s": float(err.sum()),
        "nmae": float(np.abs(err).sum() / lat.sum()),  # normalised MAE: scale-free across cells
        "bias": float(err.sum() / lat.sum()),  # > 0: LBGR underestimates
        "corr": fit_line(e, lat)[2],
    }


def _run_tune(args: tuple[tuple[str, ...], str, bool]) -> dict:
    """One run: summary (+ prediction errors when instrumented), cached by run signature."""
    overrides, cache_dir, instrumented = args

    def compute(cfg) -> dict:
        if instrumented:
            summary, rec = run_instrumented(cfg)
            out = {"summary": summary, "pred": prediction_errors(rec.decision_table())}
        else:
            from repro.backends.sim import run_cell
            from repro.metrics.summary import summarize

            out = {"summary": summarize(run_cell(cfg).records), "pred": {}}
        out["summary"].pop("provenance", None)
        out["overrides"] = list(overrides)
        return out

    return cached_run(overrides, cache_dir, compute, ".pred" if instrumented else "")


def tune_variants(params: dict[str, Sequence[str]], design: str, defaults: dict[str, str]) -> dict[str, list[str]]:
    """label -> router overrides. oat: the defaults, then one parameter changed at a time; factorial: all."""
    import itertools

    if design == "factorial":
        keys = list(params)
        out = {}
        for combo in itertools.product(*(params[k] for k in keys)):
            out[" ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))] = [
                f"{k}={v}" for k, v in zip(keys, combo)
            ]
        return out
    out = {"defaults": []}
    for k, values in params.items():
        for v in values:
            if _same(v, defaults.get(k)):
                continue
            out[f"{k.split('.')[-1]}={v}"] = [f"{k}={v}"]
    return out


def _same(a, b) -> bool:
    if b is None:
        return str(a).lower() in ("null", "none")
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def tune(
    policy: str,
    variants: dict[str, list[str]],
    cells,
    seeds,
    cache_dir: Path,
    n_jobs: int = 2,
    baseline: Sequence[str] = ("policy=cache_aware_lru",),
) -> pd.DataFrame:
    """One row per (variant, cell, seed): the summary's metrics and the prediction errors; the
    baseline's rows have variant "baseline"."""
    from multiprocessing import get_context

    bad = sorted(set(seeds) - set(TUNING_SEEDS))
    if bad:
        raise ValueError(f"tuning uses the tuning seeds {TUNING_SEEDS} only, got {bad}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    jobs, meta = [], []
    for cell in cells:
        cell_label = " ".join("limited" if v.startswith("${") else v for v in (c.split("=", 1)[1] for c in cell))
        for seed in seeds:
            common = tuple(cell) + (f"seed={seed}", "tracking=disabled")
            jobs.append((tuple(baseline) + common, str(cache_dir), False))
            meta.append({"variant": "baseline", "cell": cell_label, "seed": seed})
            for label, ov in variants.items():
                jobs.append(((f"policy={policy}", *ov) + common, str(cache_dir), True))
                meta.append({"variant": label, "cell": cell_label, "seed": seed})
    if n_jobs > 1:
        with get_context("spawn").Pool(n_jobs) as pool:
            out = pool.map(_run_tune, jobs, chunksize=1)
    else:
        out = [_run_tune(j) for j in jobs]
    rows = []
    for m, o in zip(meta, out):
        rows.append(
            {
                **m,
                **{k: v for k, v in o["summary"].items() if isinstance(v, (int, float))},
                **{f"pred_{k}": v for k, v in o["pred"].items()},
            }
        )
    return pd.DataFrame(rows)


HIGH_RATE = 16.0  # "high load" in the report: the tuning cells at this rate and above


def tune_report(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: prediction error (pooled and at high load), and the ratio to the baseline."""
    base = df[df.variant == "baseline"].set_index(["cell", "seed"])
    rate = df["cell"].str.extract(r"(\d+(?:\.\d+)?)$")[0].astype(float)
    df = df.assign(high=rate >= HIGH_RATE)
    rows = []
    for v, g in df[df.variant != "baseline"].groupby("variant", sort=False):
        gi = g.set_index(["cell", "seed"])
        b = base.loc[gi.index]
        hi = g[g.high]
        r = {
            "variant": v,
            "pred_nmae": float(g["pred_nmae"].mean()),  # the selection objective (lower is better)
            "pred_nmae_high": float(hi["pred_nmae"].mean()) if len(hi) else float("nan"),
            "pred_bias": float(g["pred_bias"].mean()),
            "pred_corr": float(g["pred_corr"].mean()),
        }
        for m, short in (("latency_p50_s", "p50_ratio"), ("latency_p95_s", "p95_ratio")):
            lr = np.log(gi[m].to_numpy() / b[m].to_numpy())
            r[short] = float(np.exp(lr.mean()))
            high = gi.index.get_level_values(0).isin(hi["cell"].unique())
            r[short + "_high"] = float(np.exp(lr[high].mean())) if high.any() else float("nan")
        r["hit_diff"] = float((gi["hit_rate"].to_numpy() - b["hit_rate"].to_numpy()).mean())
        rows.append(r)
    return pd.DataFrame(rows).set_index("variant")


def tune_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="lbgr_diagnostics tune",
        description="LBGR tuning protocol: choose the free parameters by prediction error on the tuning cells "
        "(seeds 100-102), report the ratio to Cache-Aware+LRU too. Prints the table and the choice.",
    )
    ap.add_argument(
        "--param",
        action="append",
        metavar="KEY=V1,V2,...",
        help="a router parameter and its candidate values (repeatable; default: TUNE_PARAMS)",
    )
    ap.add_argument(
        "--design",
        choices=("oat", "factorial"),
        default="oat",
        help="oat: defaults + one parameter changed at a time (default); factorial: every combination",
    )
    ap.add_argument("--policy", default="lbgr_rlt", help="the LBGR policy whose router is tuned (default lbgr_rlt)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a small proof grid: 4 req/s and 20 req/s, one budget per workload, seed 100",
    )
    ap.add_argument("--seeds", default=",".join(map(str, TUNING_SEEDS)), help="tuning seeds (subset of 100,101,102)")
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/lbgr_tune"))
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write runs.csv and report.csv here")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra Hydra override for every run (e.g. workload.num_queries=256 for a smoke test)",
    )
    a = ap.parse_args(argv)
    params: dict[str, Sequence[str]] = {}
    for spec in a.param or []:
        key, sep, vals = spec.partition("=")
        if not sep or not vals:
            ap.error(f"--param {spec!r}: expected KEY=V1,V2,...")
        params[key if key.startswith("router.") else f"router.{key}"] = tuple(vals.split(","))
    params = params or dict(TUNE_PARAMS)
    try:
        seeds = tuple(int(s) for s in a.seeds.split(","))
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected integers")
    if a.quick:
        seeds = seeds[:1]
    cells = QUICK_CELLS if a.quick else TUNE_CELLS
    cells = tuple(tuple(c) + tuple(a.override) for c in cells)
    # every candidate must compose before anything runs (bad input: a clear error first)
    router_cfg = compose_cell([f"policy={a.policy}", "tracking=disabled"]).router
    defaults = {f"router.{k}": (None if v is None else str(v)) for k, v in router_cfg.items()}
    for key in params:
        if key not in defaults:
            ap.error(f"{key} is not a key of the {a.policy} router ({', '.join(sorted(defaults))})")
    variants = tune_variants(params, a.design, defaults)
    for ov in variants.values():
        compose_cell([f"policy={a.policy}", *ov, *cells[0], "tracking=disabled"])
    try:
        df = tune(a.policy, variants, cells, seeds, a.cache_dir, a.n_jobs)
    except ValueError as exc:
        ap.error(str(exc))
    rep = tune_report(df)
    pd.set_option("display.width", 220)
    print(
        f"{len(cells)} tuning cells x {len(seeds)} seed(s) x ({len(variants)} variants + baseline) = "
        f"{len(df)} runs; policy {a.policy}; baseline CacheAware+LRU"
    )
    print(
        "pred_nmae = sum|realised - predicted E| / sum realised latency of the chosen worker (mean over runs; "
        "the objective); _high: cells at >= 16 req/s; p50/p95_ratio: geomean over runs vs the baseline"
    )
    print(rep.round(4).to_string())
    best = rep["pred_nmae"].idxmin()
    print(
        f"chosen by prediction error: {best}  (pred_nmae {rep.loc[best, 'pred_nmae']:.4f} vs defaults "
        f"{rep.loc['defaults', 'pred_nmae']:.4f})"
        if "defaults" in rep.index
        else f"chosen by prediction error: {best}"
    )
    print(
        "passed-over workers: not measured (the simulator cannot tell a request's latency on a worker it was "
        "not sent to without forking the run)"
    )
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out / "runs.csv", index=False)
        rep.to_csv(a.out / "report.csv")
    return 0
