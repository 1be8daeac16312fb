"""LBGR diagnostics: run one simulated cell with every routing decision recorded.

    PYTHONPATH=. python -m repro.routing.lbgr_diagnostics policy=lbgr_lru cluster.kv_cache_tokens=16384 \
        workload.request_rate=20 [--out /tmp/diag] [--quiet]
    PYTHONPATH=. python -m repro.routing.lbgr_diagnostics sweep tuning|evaluation \
        --variant 'LBGR+LRU=policy=lbgr_lru router.decay_factor=0.95' [--variant ...] [--per-cell]
    PYTHONPATH=. python -m repro.routing.lbgr_diagnostics tune [--param router.decay_factor=0.8,0.9,0.95 ...]
        [--design oat|factorial] [--quick]     (the tuning protocol: scripts/lbgr_tune.sh)

Not in the hot path: the router of the cell is wrapped in `DiagnosticRouter`, which asks an
LBGRRouter for its per-worker estimates (`LBGRRouter.estimate`, side-effect free apart from the
decay it would apply anyway) before every decision, and records, per decision and worker:
tracked hit h~, the worker's TRUE cached prefix at that moment (WorkerView.peek_prefix),
S^, P~, r^ (= theta . phi), E^, and the worker's real queue (waiting, running, in-flight);
per completion: realised latency, TTFT and cached tokens of the chosen worker, and the RLS
coefficients after the update. Other routers are recorded too (choice, true hits, realised
latency) so that their decisions can be compared with LBGR's.

`summarise_decisions` reduces that to the numbers the LBGR study reports (calibration of E^
against the realised latency, P~ against the realised wait, tracker error, how often the chosen
worker is not the one holding the longest prefix, and which term decided it).

The cell is built exactly as repro.backends.sim.run_cell builds it (same seeds, same parts),
so the summary equals the harness's summary.json for the same overrides (tested).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from repro.routing.base import Router

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_cell(overrides: Sequence[str]):
    """The resolved cell config for `overrides` (conf/config.yaml + overrides), without running Hydra's app."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from repro.harness.schema import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


class DiagnosticRouter(Router):
    """Wraps a router; records every decision and completion (see the module docstring)."""

    def __init__(self, inner: Router):
        self.inner = inner
        self.name = inner.name
        self.decisions: list[dict] = []
        self.per_worker: list[np.ndarray] = []  # (M, 10) rows per decision, COLUMNS below
        self.completions: dict[int, dict] = {}
        self.thetas: list[tuple[float, int, np.ndarray]] = []

    COLUMNS = ("hit_tracked", "hit_true", "service_s", "load_s", "residual_s", "predicted_s",
               "waiting", "running", "in_flight", "waiting_prefill_tokens")

    def reset(self, workers, seed):
        self.inner.reset(workers, seed)
        self.num_workers = len(workers)

    def select_worker(self, request, workers, now_s):
        from repro.kvcache import as_key
        from repro.routing.lbgr import LBGRRouter

        m = len(workers)
        rows = np.full((m, len(self.COLUMNS)), np.nan)
        key = as_key(request.prompt_tokens)
        rows[:, 1] = [w.peek_prefix(key) for w in workers]
        rows[:, 6] = [w.waiting for w in workers]
        rows[:, 7] = [w.running for w in workers]
        rows[:, 8] = [w.in_flight for w in workers]
        rows[:, 9] = [w.waiting_prefill_tokens for w in workers]
        if isinstance(self.inner, LBGRRouter):
            _, hits, service, _, predicted = self.inner.estimate(request, workers, now_s)
            loads = self.inner.load_est.copy()
            rows[:, 0] = hits
            rows[:, 2] = service
            rows[:, 3] = loads
            rows[:, 5] = predicted
            rows[:, 4] = predicted - service - loads
        choice = self.inner.select_worker(request, workers, now_s)
        self.decisions.append({"id": request.id, "now_s": now_s, "worker": int(choice),
                               "prompt_tokens": len(request.prompt_tokens), "group": request.group_id})
        self.per_worker.append(rows)
        return choice

    def on_request_complete(self, request, worker_id, latency_s, ttft_s, cached_tokens, now_s=None):
        self.inner.on_request_complete(request, worker_id, latency_s, ttft_s, cached_tokens, now_s)
        self.completions[request.id] = {"latency_s": latency_s, "ttft_s": ttft_s, "cached_tokens": cached_tokens,
                                        "finish_s": now_s}
        learner = getattr(self.inner, "learner", None)
        if learner is not None:
            self.thetas.append((now_s, worker_id, learner.theta[worker_id].copy()))

    def on_request_abandoned(self, request, worker_id, now_s=None):
        self.inner.on_request_abandoned(request, worker_id, now_s)

    # ------------------------------------------------------------------ tables
    def decision_table(self) -> pd.DataFrame:
        """One row per decision: its columns + `<col>_chosen`, `<col>_w<i>` per worker, realised outcome."""
        d = pd.DataFrame(self.decisions)
        arr = np.stack(self.per_worker)  # (n, M, C)
        idx = np.arange(len(d))
        ch = d["worker"].to_numpy()
        for c, name in enumerate(self.COLUMNS):
            d[f"{name}_chosen"] = arr[idx, ch, c]
            for i in range(arr.shape[1]):
                d[f"{name}_w{i}"] = arr[:, i, c]
        comp = pd.DataFrame.from_dict(self.completions, orient="index")
        comp.index.name = "id"
        return d.join(comp, on="id")

    def theta_table(self) -> pd.DataFrame:
        if not self.thetas:
            return pd.DataFrame()
        t = np.array([x[0] for x in self.thetas])
        w = np.array([x[1] for x in self.thetas])
        th = np.stack([x[2] for x in self.thetas])
        df = pd.DataFrame({"now_s": t, "worker": w})
        for k in range(th.shape[1]):
            df[f"theta{k}"] = th[:, k]
        return df


def run_instrumented(cfg) -> tuple[dict, DiagnosticRouter]:
    """Run the cell `cfg` exactly as the harness does, with the router wrapped; (summary dict, recorder)."""
    from repro.backends.sim import run_cell
    from repro.metrics.summary import summarize

    recorders: list[DiagnosticRouter] = []

    def wrap(router):
        recorders.append(DiagnosticRouter(router))
        return recorders[-1]

    result = run_cell(cfg, wrap_router=wrap)
    return summarize(result.records), recorders[0]


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, correlation) of y on x; NaNs when degenerate."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan"), float("nan"), float("nan")
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept), float(np.corrcoef(x, y)[0, 1])


def summarise_decisions(d: pd.DataFrame, m: int) -> dict:
    """The numbers of the LBGR study from one decision table (see the module docstring)."""
    out: dict[str, Any] = {}
    lat = d["latency_s"].to_numpy()
    prompt = d["prompt_tokens"].to_numpy()
    out["decisions"] = len(d)
    # Tracker: tracked vs true cached prefix on the chosen worker at the decision, and vs the
    # tokens the worker really served from cache (admission may come much later).
    ht, hx = d["hit_tracked_chosen"].to_numpy(), d["hit_true_chosen"].to_numpy()
    if np.isfinite(ht).any():
        out["tracker_hit_rate_tracked"] = float(np.nansum(ht) / prompt.sum())
        out["tracker_abs_err_frac"] = float(np.nanmean(np.abs(ht - hx) / prompt))
        out["tracker_overestimates_frac"] = float(np.nanmean(ht > hx))
    out["hit_true_at_decision_chosen"] = float(np.nansum(hx) / prompt.sum())
    out["hit_served"] = float(d["cached_tokens"].sum() / prompt.sum())
    true_all = np.stack([d[f"hit_true_w{i}"].to_numpy() for i in range(m)], axis=1)
    best = true_all.max(axis=1)
    out["hit_true_best_worker"] = float(best.sum() / prompt.sum())
    # Spread: the chosen worker is not one holding the longest prefix (when some worker holds one).
    some = best > 0
    out["chose_shorter_prefix_frac"] = float(np.mean(hx[some] < best[some])) if some.any() else float("nan")
    # Queue balance: std/mean of in-flight at decisions.
    infl = np.stack([d[f"in_flight_w{i}"].to_numpy() for i in range(m)], axis=1)
    out["in_flight_mean"] = float(infl.mean())
    out["in_flight_imbalance"] = float(np.mean(infl.max(axis=1) - infl.min(axis=1)))
    out["latency_mean_s"] = float(np.mean(lat))
    if np.isfinite(d["predicted_s_chosen"]).any():
        e = d["predicted_s_chosen"].to_numpy()
        s = d["service_s_chosen"].to_numpy()
        p = d["load_s_chosen"].to_numpy()
        r = d["residual_s_chosen"].to_numpy()
        out["E_hat_mean_s"] = float(np.mean(e))
        out["S_hat_mean_s"] = float(np.mean(s))
        out["P_mean_s"] = float(np.mean(p))
        out["r_hat_mean_s"] = float(np.mean(r))
        out["E_err_mean_s"] = float(np.mean(lat - e))
        out["E_abs_err_mean_s"] = float(np.mean(np.abs(lat - e)))
        out["E_fit_slope_intercept_corr"] = _fit(e, lat)
        # The realised wait beyond the predicted service vs the load estimate.
        out["P_vs_wait_slope_intercept_corr"] = _fit(p, lat - s)
        # True queue (in-flight on the chosen worker) vs P~: is P~ tracking the queue?
        out["P_vs_in_flight_corr"] = _fit(d["in_flight_chosen"].to_numpy(), p)[2]
        # Which term decided: for decisions where the chosen worker is not the longest-prefix one,
        # compare the chosen worker's terms with those of the best-prefix worker.
        tracked_all = np.stack([d[f"hit_tracked_w{i}"].to_numpy() for i in range(m)], axis=1)
        tbest = tracked_all.argmax(axis=1)
        idx = np.arange(len(d))
        ch = d["worker"].to_numpy()
        moved = (tbest != ch) & (tracked_all[idx, tbest] > tracked_all[idx, ch])
        out["moved_from_tracked_prefix_frac"] = float(moved.mean())
        if moved.any():
            def term(name):
                a = np.stack([d[f"{name}_w{i}"].to_numpy() for i in range(m)], axis=1)
                return a[idx, tbest][moved] - a[idx, ch][moved]

            out["moved_delta_S_mean_s"] = float(np.mean(term("service_s")))  # > 0: prefix worker slower to serve?? (< 0 normally)
            out["moved_delta_P_mean_s"] = float(np.mean(term("load_s")))
            out["moved_delta_r_mean_s"] = float(np.mean(term("residual_s")))
            # How many moves the residual alone decided (without r the prefix worker would win).
            dS, dP, dR = term("service_s"), term("load_s"), term("residual_s")
            out["moved_decided_by_residual_frac"] = float(np.mean((dS + dP <= 0) & (dS + dP + dR > 0)))
            out["moved_decided_by_load_frac"] = float(np.mean(dS + dP > 0))
    return out


# ---------------------------------------------------------------------------- protocol sweeps
# The tuning protocol of the LBGR study (REPRODUCE.md, "LBGR reconstruction"): constants are
# chosen on TUNING cells only, then checked on the EVALUATION cells (fig2 / fig5 settings,
# seeds 0-2), which were never used to pick a value. UltraChat is in no tuning cell.
TUNING_SEEDS = (100, 101, 102)
TUNING_CELLS = tuple(
    [("workload=gsp", f"cluster.kv_cache_tokens={c}", f"workload.request_rate={r}")
     for c in (16384, 32768) for r in (8.0, 12.0, 16.0, 20.0)]
    + [("workload=sharegpt", f"cluster.kv_cache_tokens={c}", f"workload.request_rate={r}")
       for c in (20480, 40960) for r in (8.0, 12.0, 16.0, 20.0)]
    + [("workload=loogle", "workload.request_rate=12.0")]
    + [("workload=gsp", "cluster.kv_cache_tokens=32768", "workload.request_rate=12.0", f"workload.output_len={o}")
       for o in (32, 128)]  # the decode-heavy regime of fig12
)
EVALUATION_SEEDS = (0, 1, 2)
EVALUATION_CELLS = tuple(
    [(f"workload={w}", f"cluster.kv_cache_tokens=${{limited_kv_cache_tokens.{w}}}", "workload.request_rate=12.0")
     for w in ("gsp", "sharegpt", "ultrachat", "loogle")]  # fig2
    + [("workload=gsp", "cluster.kv_cache_tokens=${limited_kv_cache_tokens.gsp}", f"workload.request_rate={r}")
       for r in (4.0, 8.0, 16.0, 20.0)]  # fig5 (its 12 req/s cell is fig2's GSP cell)
)
CELL_SETS = {"tuning": (TUNING_CELLS, TUNING_SEEDS), "evaluation": (EVALUATION_CELLS, EVALUATION_SEEDS)}


def _run_summary(args: tuple[tuple[str, ...], str]) -> tuple[tuple[str, ...], dict]:
    overrides, cache_dir = args
    import hashlib

    from repro.harness.compose import cell_signature, resolve

    cfg = compose_cell(overrides)
    # The run signature: every result-affecting setting, the router's resolved keys included.
    sig = cell_signature(resolve(cfg))
    path = Path(cache_dir) / (sig + ".json")
    if path.exists():
        return overrides, json.loads(path.read_text())["summary"]
    from repro.backends.sim import run_cell
    from repro.metrics.summary import summarize

    res = run_cell(cfg)
    summary = summarize(res.records)
    summary.pop("provenance", None)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"overrides": list(overrides), "summary": summary}))
    tmp.replace(path)
    return overrides, summary


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
                meta.append({"cell": " ".join("limited" if v.startswith("${") else v for v in vals),
                             "seed": seed, "policy": label})
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
    cols = {"hit_rate": "hit", "latency_p50_s": "P50 lat (s)", "latency_p95_s": "P95 lat (s)",
            "ttft_p50_s": "P50 TTFT (s)", "ttft_p95_s": "P95 TTFT (s)", "throughput_rps": "tput (req/s)"}
    g = df.groupby(["cell", "policy"], sort=False)[list(cols)].mean()
    lines = ["| cell | system | " + " | ".join(cols.values()) + " |", "|" + "---|" * (len(cols) + 2)]
    for (cell, pol), row in g.iterrows():
        vals = [f"{row[c]:.3f}" if c == "hit_rate" else f"{row[c]:.3g}" for c in cols]
        lines.append(f"| {cell} | {pol} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def sweep_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="lbgr_diagnostics sweep", description="protocol sweep: ratios to a baseline")
    ap.add_argument("cell_set", choices=sorted(CELL_SETS))
    ap.add_argument("--variant", action="append", required=True, metavar="LABEL=OVERRIDES",
                    help="a policy variant: label=space-separated Hydra overrides (repeatable; no '=' in the label)")
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
        piv = df.pivot_table(index=["cell", "seed"], columns="policy",
                             values=["latency_p50_s", "latency_p95_s", "hit_rate"], sort=False)
        print(piv.round(3).to_string())
    if args.markdown:
        print(markdown_table(df))
    print(compare(df, base).round(3).to_string())
    return 0


# ---------------------------------------------------------------------------- tuning protocol
# LBGR's free parameters are chosen by what LBGR is: a latency predictor. `tune` runs every
# candidate setting on the TUNE cells (seeds 100-102 only; never the figures' cells or seeds)
# with the decisions recorded, and scores each setting by its prediction error: predicted E of
# the chosen worker vs the realised end-to-end latency of that request. The ratio to the
# baseline (Cache-Aware+LRU, same cells and seeds) is reported next to it, never used to choose.
# Passed-over workers: the simulator cannot tell what a request would have taken on a worker it
# was not sent to without forking the whole simulation at the decision, which the backend does
# not offer; their error is not measured (the report says so).
TUNE_RATES = (4.0, 8.0, 12.0, 16.0, 20.0)
TUNE_CELLS = tuple(
    [(f"workload={w}", f"cluster.kv_cache_tokens={kv}", f"workload.request_rate={r}")
     for w, half in (("gsp", 16384), ("sharegpt", 20480), ("ultrachat", 32768))
     for kv in (half, f"${{limited_kv_cache_tokens.{w}}}") for r in TUNE_RATES]  # half of / the limited budget
    + [("workload=loogle", f"workload.request_rate={r}") for r in TUNE_RATES]  # memory-formula budget
)
# --quick: each workload at its limited budget, at the lowest and the highest rate, the first tuning seed
QUICK_CELLS = tuple(c for c in TUNE_CELLS if c[-1].endswith(("=4.0", "=20.0"))
                    and (c[0] == "workload=loogle" or "${" in c[1]))
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
        "corr": _fit(e, lat)[2],
    }


def _run_tune(args: tuple[tuple[str, ...], str, bool]) -> dict:
    """One run: summary (+ prediction errors when instrumented), cached by run signature."""
    overrides, cache_dir, instrumented = args
    from repro.harness.compose import cell_signature, resolve

    cfg = compose_cell(overrides)
    sig = cell_signature(resolve(cfg))
    path = Path(cache_dir) / (sig + (".pred" if instrumented else "") + ".json")
    if path.exists():
        return json.loads(path.read_text())
    if instrumented:
        summary, rec = run_instrumented(cfg)
        out = {"summary": summary, "pred": prediction_errors(rec.decision_table())}
    else:
        from repro.backends.sim import run_cell
        from repro.metrics.summary import summarize

        out = {"summary": summarize(run_cell(cfg).records), "pred": {}}
    out["summary"].pop("provenance", None)
    out["overrides"] = list(overrides)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=float))
    tmp.replace(path)
    return out


def tune_variants(params: dict[str, Sequence[str]], design: str, defaults: dict[str, str]) -> dict[str, list[str]]:
    """label -> router overrides. oat: the defaults, then one parameter changed at a time; factorial: all."""
    import itertools

    if design == "factorial":
        keys = list(params)
        out = {}
        for combo in itertools.product(*(params[k] for k in keys)):
            out[" ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo))] = [f"{k}={v}" for k, v in zip(keys, combo)]
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


def tune(policy: str, variants: dict[str, list[str]], cells, seeds, cache_dir: Path, n_jobs: int = 2,
         baseline: Sequence[str] = ("policy=cache_aware_lru",)) -> pd.DataFrame:
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
        rows.append({**m, **{k: v for k, v in o["summary"].items() if isinstance(v, (int, float))},
                     **{f"pred_{k}": v for k, v in o["pred"].items()}})
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
        r = {"variant": v,
             "pred_nmae": float(g["pred_nmae"].mean()),  # the selection objective (lower is better)
             "pred_nmae_high": float(hi["pred_nmae"].mean()) if len(hi) else float("nan"),
             "pred_bias": float(g["pred_bias"].mean()),
             "pred_corr": float(g["pred_corr"].mean())}
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
                    "(seeds 100-102), report the ratio to Cache-Aware+LRU too. Prints the table and the choice.")
    ap.add_argument("--param", action="append", metavar="KEY=V1,V2,...",
                    help="a router parameter and its candidate values (repeatable; default: TUNE_PARAMS)")
    ap.add_argument("--design", choices=("oat", "factorial"), default="oat",
                    help="oat: defaults + one parameter changed at a time (default); factorial: every combination")
    ap.add_argument("--policy", default="lbgr_rlt", help="the LBGR policy whose router is tuned (default lbgr_rlt)")
    ap.add_argument("--quick", action="store_true",
                    help="a small proof grid: 4 req/s and 20 req/s, one budget per workload, seed 100")
    ap.add_argument("--seeds", default=",".join(map(str, TUNING_SEEDS)), help="tuning seeds (subset of 100,101,102)")
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/lbgr_tune"))
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write runs.csv and report.csv here")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra Hydra override for every run (e.g. workload.num_queries=256 for a smoke test)")
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
    print(f"{len(cells)} tuning cells x {len(seeds)} seed(s) x ({len(variants)} variants + baseline) = "
          f"{len(df)} runs; policy {a.policy}; baseline CacheAware+LRU")
    print("pred_nmae = sum|realised - predicted E| / sum realised latency of the chosen worker (mean over runs; "
          "the objective); _high: cells at >= 16 req/s; p50/p95_ratio: geomean over runs vs the baseline")
    print(rep.round(4).to_string())
    best = rep["pred_nmae"].idxmin()
    print(f"chosen by prediction error: {best}  (pred_nmae {rep.loc[best, 'pred_nmae']:.4f} vs defaults "
          f"{rep.loc['defaults', 'pred_nmae']:.4f})" if "defaults" in rep.index else f"chosen by prediction error: {best}")
    print("passed-over workers: not measured (the simulator cannot tell a request's latency on a worker it was "
          "not sent to without forking the run)")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out / "runs.csv", index=False)
        rep.to_csv(a.out / "report.csv")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        return sweep_main(argv[1:])
    if argv[:1] == ["tune"]:
        return tune_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
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
        result["theta_final"] = {int(w): [round(float(v), 4) for v in row] for w, row in
                                 last.filter(like="theta").iterrows()}
        half = th[th["now_s"] >= th["now_s"].median()]
        result["theta_second_half_mean"] = {int(w): [round(float(v), 4) for v in g.filter(like="theta").mean()]
                                            for w, g in half.groupby("worker")}
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
