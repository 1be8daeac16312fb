"""Today's baselines (beyond the paper): the six systems beside SGLang 0.5.23's own eviction
policies (lfu, slru) and today's routers (smg 1.13 cache-aware / prefix_hash / least_load, LMetric).

results/todays_baselines/ (conf/exp/todays_baselines.yaml: workload x 14 systems x seeds 0-2,
the paper's protocol). Bars: mean over seeds, error bars ± SD. The caption says, per benchmark,
where RLT stands against the best of SGLang's own policies (same router) and LBGR against the
best of today's routers (same eviction, LRU), by hit rate and P50 latency.
"""

from __future__ import annotations

import pandas as pd

from repro.figures.load import SYSTEM
from repro.figures.perf import PerfFigure

WORKLOAD = "workload.name"
BENCHMARKS = ("gsp", "sharegpt", "ultrachat", "loogle")  # the figure's facet order
# (ours, its rivals): eviction under one router; routing over one eviction
EVICTION_ROWS = {
    "CacheAware+RLT": ("CacheAware+LRU", "CacheAware+LFU", "CacheAware+SLRU"),
    "LBGR+RLT": ("LBGR+LRU", "LBGR+LFU", "LBGR+SLRU"),
}
ROUTER_ROWS = {
    "LBGR+LRU": ("CacheAware+LRU", "CacheAware(smg)+LRU", "PrefixHash(smg)+LRU", "LeastLoad(smg)+LRU", "LMetric+LRU")
}


def standing(df: pd.DataFrame) -> list[dict]:
    """Per benchmark and comparison: ours, the best rival (hit rate: highest; latency: lowest), both values."""
    cols = [c for c in ("hit_rate", "latency_p50_s") if c in df]
    means = df.groupby([WORKLOAD, SYSTEM], sort=False)[cols].mean()
    rows = []
    present = list(dict.fromkeys(df[WORKLOAD]))
    for wl in [w for w in BENCHMARKS if w in present] + [w for w in present if w not in BENCHMARKS]:
        for ours, rivals in (*EVICTION_ROWS.items(), *ROUTER_ROWS.items()):
            have = [r for r in rivals if (wl, r) in means.index]
            if (wl, ours) not in means.index or not have:
                continue
            for metric in cols:
                vals = {r: float(means.loc[(wl, r), metric]) for r in have}
                best = (max if metric == "hit_rate" else min)(vals, key=vals.get)
                rows.append(
                    {
                        "workload": wl,
                        "ours": ours,
                        "metric": metric,
                        "value": float(means.loc[(wl, ours), metric]),
                        "best_rival": best,
                        "rival_value": vals[best],
                    }
                )
    return rows


def _caption(df: pd.DataFrame) -> str:
    by: dict[tuple, dict] = {}
    for r in standing(df):
        by.setdefault((r["workload"], r["ours"]), {})[r["metric"]] = r
    said = []
    for (wl, ours), m in by.items():
        bits = []
        if "hit_rate" in m:
            h = m["hit_rate"]
            bits.append(f"hit rate {h['value']:.3f} vs {h['rival_value']:.3f} ({h['best_rival']})")
        if "latency_p50_s" in m:
            lat = m["latency_p50_s"]
            bits.append(f"P50 latency {lat['value']:.3g} s vs {lat['rival_value']:.3g} s ({lat['best_rival']})")
        said.append(f"{wl}, {ours}: " + ", ".join(bits))
    if not said:
        return ""
    return (
        "Where ours stand against the best rival (mean over seeds; eviction rows: the same router with LRU / "
        "LFU / SLRU; router rows: today's routers over LRU): " + "; ".join(said) + "."
    )


FIGURE = PerfFigure(
    name="todays_baselines",
    exp="todays_baselines",
    title="Today's baselines: RLT and LBGR against SGLang 0.5.23's LFU / SLRU and today's routers (beyond the paper)",
    kind="bars",
    facets=(WORKLOAD,),
    caption_extra=_caption,
    notes="LFU / SLRU: SGLang 0.5.23's --radix-eviction-policy strategies (hit count = inserts past the request's "
    "inserted_len); CacheAware(smg), PrefixHash(smg), LeastLoad(smg): smg 1.13.0's rules; LMetric: new prefill "
    "tokens x (running batch + 1) (docs/ALGORITHMS.md, today's baselines).",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
