"""Why LBGR+RLT loses at high load: its predictions against what happened, on regime_map cells.

    python -m repro.analysis.lbgr_diagnostics highload [--rates 8,16,24,32] [--seeds 0,1]
        [--budget 32768] [--workloads gsp] [--systems LBGR+RLT,CacheAware+LRU]
        [--override KEY=VALUE ...] [--vary router.decay_interval_s=0.01,0.1,5] [--requests]
        [--out results_analysis/lbgr_highload]

Runs LBGR+RLT and CacheAware+LRU on the regime_map cells (GSP, the given rates and per-worker KV
budget, default the workload's limited one; the same cells as results/regime_map/, and at 12 req/s
as fig2_main, so the same summaries) with every decision recorded (decisions.py), and splits each request's realised latency into
  queue wait  = start of its first prefill step - arrival,
  prefill     = first token - that start (its chunks and the other requests batched with them),
  decode      = finish - first token (its decode steps and the prefill steps run between them),
and LBGR's prediction E = S + P + r of the chosen worker into S's prefill part, S's decode part,
the queue-load estimate P and the learned residual r. Per cell: hit rate, compute (busy
fraction, prefill tokens), balance (busiest worker's share), how a prompt group (GSP: one shared
system prompt) is split over workers, the realised parts, and for LBGR
the bias / MAE / correlation of E against the latency and of P against the queue wait.
Writes <out>/cells.csv (one row per cell and seed), <out>/table.md (seed means) and with
--requests <out>/requests.parquet (one row per routed request).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from repro.analysis.cells import compose_cell
from repro.analysis.decisions import fit_line, run_instrumented, summarise_decisions
from repro.fileio import write_atomic

SYSTEMS = {"LBGR+RLT": "lbgr_rlt", "CacheAware+LRU": "cache_aware_lru"}
MORE_SYSTEMS = {"CacheAware+RLT": "cache_aware_rlt", "RoundRobin+LRU": "round_robin_lru", "Random+LRU": "random_lru"}
RATES = (8.0, 16.0, 24.0, 32.0)
SEEDS = (0, 1)
WORKLOADS = ("gsp",)
OUT = Path("results_analysis/lbgr_highload")


def cell_overrides(
    policy: str, rate: float, budget: int | None, seed: int, extra: Sequence[str] = (), workload: str = "gsp"
) -> list[str]:
    """The cell's Hydra overrides; budget None: the workload's limited budget."""
    kv = f"${{limited_kv_cache_tokens.{workload}}}" if budget is None else budget
    return [
        "exp=regime_map",
        f"workload={workload}",
        f"policy={policy}",
        f"workload.request_rate={rate}",
        f"cluster.kv_cache_tokens={kv}",
        f"seed={seed}",
        "tracking=disabled",
        *extra,
    ]


def request_frame(d: pd.DataFrame) -> pd.DataFrame:
    """The decision table with the realised parts of each latency and the parts of LBGR's E."""
    d = d.copy()
    d["prefill_real_s"] = d["ttft_s"] - d["queue_wait_s"]
    d["decode_real_s"] = d["latency_s"] - d["ttft_s"]
    d["decode_pred_s"] = d["service_s_chosen"] - d["prefill_pred_s_chosen"]
    d["miss_tokens"] = d["prompt_tokens"] - d["cached_tokens"]
    return d


def cell_row(d: pd.DataFrame, m: int, busy_s: Sequence[float], prefill_busy_s: Sequence[float]) -> dict:
    """One cell's numbers from its request frame (module docstring)."""
    lat, wait = d["latency_s"].to_numpy(), d["queue_wait_s"].to_numpy()
    makespan = float(d["finish_s"].max() - d["now_s"].min())
    share = d["worker"].value_counts(normalize=True).reindex(range(m), fill_value=0.0)
    per_group = d.groupby("group")["worker"]
    diag = summarise_decisions(d, m)
    row = {
        "requests": len(d),
        "p50_latency_s": float(np.median(lat)),
        "mean_latency_s": float(lat.mean()),
        "hit_rate": diag["hit_served"],
        "chose_shorter_prefix_frac": diag["chose_shorter_prefix_frac"],
        "miss_tokens_per_req": float(d["miss_tokens"].mean()),
        "busy_frac": float(np.mean(busy_s) / makespan) if len(busy_s) else np.nan,
        "prefill_busy_frac": float(np.mean(prefill_busy_s) / makespan) if len(busy_s) else np.nan,
        "max_worker_share": float(share.max()),
        # share of requests on their group's most used worker; workers a group is spread over
        "group_home_share": float(per_group.agg(lambda w: w.value_counts().iloc[0]).sum() / len(d)),
        "workers_per_group": float(per_group.nunique().mean()),
        "wait_mean_s": float(wait.mean()),
        "wait_p50_s": float(np.median(wait)),
        "prefill_mean_s": float(d["prefill_real_s"].mean()),
        "decode_mean_s": float(d["decode_real_s"].mean()),
        "wait_share": float(wait.sum() / lat.sum()),
    }
    e = d["predicted_s_chosen"].to_numpy()
    if np.isfinite(e).any():
        p = d["load_s_chosen"].to_numpy()
        row.update(
            {
                "E_mean_s": float(e.mean()),
                "E_bias_s": float(np.mean(lat - e)),  # > 0: LBGR underestimates
                "E_mae_s": float(np.mean(np.abs(lat - e))),
                "E_corr": fit_line(e, lat)[2],
                "S_prefill_pred_s": float(d["prefill_pred_s_chosen"].mean()),
                "S_decode_pred_s": float(d["decode_pred_s"].mean()),
                "P_mean_s": float(p.mean()),
                "r_mean_s": float(d["residual_s_chosen"].mean()),
                "P_bias_s": float(np.mean(wait - p)),  # > 0: P below the realised queue wait
                "P_wait_corr": fit_line(p, wait)[2],
                "tracker_overestimates_frac": diag["tracker_overestimates_frac"],
                "moved_by_load_frac": diag.get("moved_decided_by_load_frac", np.nan)
                * diag["moved_from_tracked_prefix_frac"],
                "moved_by_residual_frac": (
                    diag.get("moved_decided_by_residual_frac", np.nan) * diag["moved_from_tracked_prefix_frac"]
                ),
            }
        )
    return row


def run_cell_diag(
    policy: str, rate: float, budget: int | None, seed: int, extra: Sequence[str] = (), workload: str = "gsp"
) -> tuple[dict, pd.DataFrame]:
    """(cell row, request frame) of one cell."""
    cfg = compose_cell(cell_overrides(policy, rate, budget, seed, extra, workload))
    summary, rec = run_instrumented(cfg)
    d = request_frame(rec.decision_table())
    row = cell_row(d, int(cfg.cluster.num_workers), rec.busy_s(), rec.prefill_busy_s)
    row["budget"] = int(cfg.cluster.kv_cache_tokens)
    if row["requests"] != summary["num_requests"] or abs(row["p50_latency_s"] - summary["latency_p50_s"]) > 1e-9:
        raise AssertionError("the recorded requests disagree with the cell's summary")
    return row, d


def highload(
    rates=RATES,
    seeds=SEEDS,
    budget: int | None = None,
    systems: Sequence[str] = tuple(SYSTEMS),
    extra: Sequence[str] = (),
    workloads: Sequence[str] = WORKLOADS,
    variants: Sequence[str] = ("",),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells: one row per workload x rate x system x variant x seed, requests: one row per routed
    request); `extra`: Hydra overrides of every cell; `variants`: one more override each ("" = none)."""
    rows, frames = [], []
    for workload in workloads:
        for rate in rates:
            for system in systems:
                for variant in variants:
                    label = f"{system} {variant}".strip()
                    for seed in seeds:
                        more = [*extra, variant] if variant else extra
                        row, d = run_cell_diag({**SYSTEMS, **MORE_SYSTEMS}[system], rate, budget, seed, more, workload)
                        key = {"workload": workload, "system": label, "rate": rate, "seed": seed}
                        rows.append({**key, **row})
                        frames.append(d.assign(**key))
    return pd.DataFrame(rows), pd.concat(frames, ignore_index=True)


# (column, header, format) of table.md
TABLE = (
    ("p50_latency_s", "P50 s", ".3f"),
    ("hit_rate", "hit", ".3f"),
    ("miss_tokens_per_req", "miss tok/req", ".0f"),
    ("busy_frac", "busy", ".2f"),
    ("prefill_busy_frac", "prefill busy", ".2f"),
    ("max_worker_share", "max share", ".3f"),
    ("group_home_share", "group home", ".3f"),
    ("workers_per_group", "workers/group", ".2f"),
    ("chose_shorter_prefix_frac", "shorter prefix", ".3f"),
    ("wait_mean_s", "wait", ".3f"),
    ("prefill_mean_s", "prefill", ".3f"),
    ("decode_mean_s", "decode", ".3f"),
    ("E_mean_s", "E", ".3f"),
    ("E_bias_s", "E bias", "+.3f"),
    ("E_mae_s", "E MAE", ".3f"),
    ("E_corr", "corr(E,lat)", ".2f"),
    ("S_prefill_pred_s", "S prefill", ".3f"),
    ("S_decode_pred_s", "S decode", ".3f"),
    ("P_mean_s", "P", ".3f"),
    ("r_mean_s", "r", ".3f"),
    ("P_bias_s", "wait-P", "+.3f"),
    ("P_wait_corr", "corr(P,wait)", ".2f"),
)


def table_md(cells: pd.DataFrame) -> str:
    """Seed means per (workload, KV budget, rate, system) as a markdown table."""
    keys = ["workload", "budget", "rate", "system"]
    mean = cells.groupby(keys, sort=True).mean(numeric_only=True).reset_index()
    head = "| workload | KV/worker | rate | system | " + " | ".join(h for _, h, _ in TABLE) + " |"
    lines = [head, "|" + "---|" * (len(TABLE) + len(keys))]
    for _, r in mean.iterrows():
        vals = ["" if not np.isfinite(r.get(c, np.nan)) else format(r[c], f) for c, _, f in TABLE]
        lines.append(
            f"| {r['workload']} | {r['budget']:.0f} | {r['rate']:g} | {r['system']} | " + " | ".join(vals) + " |"
        )
    seeds = ", ".join(str(s) for s in sorted(cells["seed"].unique()))
    extra = cells.attrs.get("extra") or ()
    note = (
        f"Seed means over seeds {seeds}{''.join(', ' + e for e in extra)}; seconds. "
        "wait / prefill / decode: the realised parts of the latency (their means add up to the mean "
        "latency); E = S prefill + S decode + P + r: LBGR's prediction for the chosen worker; "
        "E bias = mean(latency - E), wait-P = mean(queue wait - P); busy / prefill busy: mean fraction of the "
        "makespan a worker spends in steps / in steps that prefill; shorter prefix: the chosen worker holds a shorter prefix "
        "than another worker did at the decision; group home: share of requests on their prompt "
        "group's most used worker."
    )
    return "\n".join([note, "", *lines]) + "\n"


def highload_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument(
        "--budget", type=int, default=None, help="KV tokens per worker (default: the workload's limited budget)"
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join({**SYSTEMS, **MORE_SYSTEMS})}")
    ap.add_argument("--override", action="append", default=[], help="Hydra override for every cell (repeatable)")
    ap.add_argument("--vary", help="KEY=V1,V2,...: one row per value (e.g. router.decay_interval_s=0.01,5)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--requests", action="store_true", help="also write requests.parquet")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    variants = [""]
    if args.vary:
        key, values = args.vary.split("=", 1)
        variants = [f"{key}={v}" for v in values.split(",")]
    cells, requests = highload(
        rates, seeds, args.budget, args.systems.split(","), args.override, args.workloads.split(","), variants
    )
    cells.attrs["extra"] = args.override
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "cells.csv", cells.to_csv(index=False, float_format="%.6g"))
    cmd = " ".join(["python -m repro.analysis.lbgr_diagnostics highload", *map(shlex.quote, argv)])
    text = f"`{cmd}`\n\n" + table_md(cells)
    write_atomic(args.out / "table.md", text)
    if args.requests:
        requests.to_parquet(args.out / "requests.parquet")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(highload_main())
