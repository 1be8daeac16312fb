"""Regime map (beyond the paper): where the paper's two claims hold on GSP, over request rate x
per-worker KV budget.

Left: LBGR+RLT / CacheAware+LRU P50 latency (< 1: LBGR+RLT faster, the paper's LBGR claim).
Middle: CacheAware+RLT / CacheAware+LRU hit rate (> 1: RLT keeps more, the paper's RLT claim,
both under the cache-aware router). Right: LBGR+RLT / CacheAware(smg)+LRU P50 latency, the LBGR
claim against today's router (smg 1.13.0's cache-aware rule, router cache_aware_smg). Each cell is the ratio of seed means, on a log colour scale
centred at 1 (blue: the paper's direction, red: the opposite). A cell whose per-seed
difference does not exceed 2 standard errors over seeds (the claims table's rule,
repro.figures.claims.paired) is a tie: its number is printed in grey italics with "≈".
With one seed every difference counts (no noise estimate). A cell where either compared system is
backlogged or overloaded (summary.json `regime`, worst over seeds) carries that regime's mark in
its upper right corner (repro.figures.style.REGIME_MARKS).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repro.figures import captions
from repro.figures.load import REGIME, SEED, SYSTEM, load_cells, require, worst_regime
from repro.figures.style import (
    REGIME_NOTE,
    add_caption,
    apply_style,
    mark_regimes,
    regime_legend_handles,
    save_figure,
    write_text,
)

NAME = EXP = "regime_map"
TITLE = (
    "Regime map: where LBGR+RLT beats Cache-Aware+LRU (sglang-router 0.3.2 and smg 1.13), and RLT beats LRU, "
    "on GSP (beyond the paper)"
)
RATE, BUDGET = "workload.request_rate", "cluster.kv_cache_tokens"
WHY_COMMAND = "python -m repro.analysis.lbgr_diagnostics highload"
# (panel title, numerator system, denominator system, metric, direction of the paper's claim: -1 = ratio < 1)
PANELS = (
    ("LBGR+RLT / CacheAware+LRU, P50 latency", "LBGR+RLT", "CacheAware+LRU", "latency_p50_s", -1),
    ("CacheAware+RLT / CacheAware+LRU, hit rate", "CacheAware+RLT", "CacheAware+LRU", "hit_rate", +1),
    ("LBGR+RLT / CacheAware(smg)+LRU, P50 latency", "LBGR+RLT", "CacheAware(smg)+LRU", "latency_p50_s", -1),
)


def cells(results_dir: str | Path) -> pd.DataFrame:
    df = require(load_cells(results_dir, EXP), EXP, [SYSTEM, RATE, BUDGET])
    df = df.copy()
    df[RATE] = pd.to_numeric(df[RATE])
    df[BUDGET] = pd.to_numeric(df[BUDGET])
    dup = df.duplicated([SYSTEM, RATE, BUDGET, SEED], keep=False)
    if dup.any():
        raise ValueError(
            f"results/{EXP}/: cells {sorted(df.loc[dup, 'signature'])} are the same point and seed "
            "(a stale cell from an older grid?)"
        )
    return df


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (panel, rate, budget): ratio of seed means, outcome (claims' paired rule), seeds."""
    from repro.figures.claims import TIE, paired

    rows = []
    for title, num, den, metric, sign in PANELS:
        for (rate, budget), g in df.groupby([RATE, BUDGET], sort=True):
            a = g[g[SYSTEM] == num].set_index(SEED)[metric]
            b = g[g[SYSTEM] == den].set_index(SEED)[metric]
            common = sorted(set(a.index) & set(b.index))
            if not common:
                continue
            d = np.array([a[s] - b[s] for s in common]) * sign  # > 0: the paper's direction
            outcome = paired(d)
            ratio = float(a.mean() / b.mean()) if b.mean() > 0 else np.nan
            regimes = [
                worst_regime(g.loc[(g[SYSTEM] == sys) & g[SEED].isin(common), REGIME]) if REGIME in g else None
                for sys in (num, den)
            ]
            rows.append(
                {
                    "panel": title,
                    "metric": metric,
                    "numerator": num,
                    "denominator": den,
                    RATE: rate,
                    BUDGET: int(budget),
                    "ratio": ratio,
                    "tie": outcome == TIE,
                    "paper_direction": outcome > 0,
                    "n_seeds": len(common),
                    "regime_numerator": regimes[0],
                    "regime_denominator": regimes[1],
                    REGIME: worst_regime(regimes),
                }
            )
    return pd.DataFrame(rows)


def table(results_dir: str | Path):
    df = cells(results_dir)
    return df, ratios(df)


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.ticker import FuncFormatter, NullFormatter

    df, r = table(results_dir)
    if r.empty:
        raise ValueError(f"results/{EXP}/ has no point with both systems of a panel")
    apply_style()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 3.6), squeeze=False)
    for ax, (title, _, _, _metric, sign) in zip(axes[0], PANELS):
        p = r[r["panel"] == title]
        rates = sorted(p[RATE].unique())
        budgets = sorted(p[BUDGET].unique())
        grid = np.full((len(budgets), len(rates)), np.nan)
        tie = np.zeros_like(grid, dtype=bool)
        regime = [[None] * len(rates) for _ in budgets]
        for _, row in p.iterrows():
            i, j = budgets.index(row[BUDGET]), rates.index(row[RATE])
            grid[i, j], tie[i, j], regime[i][j] = row["ratio"], row["tie"], row[REGIME]
        finite = grid[np.isfinite(grid) & (grid > 0)]
        span = float(np.max(np.abs(np.log(finite)))) if len(finite) else 0.1
        span = max(span, np.log(1.05))
        # colours: the paper's direction blue, the opposite red (latency: ratio < 1 is the paper's)
        cmap = "RdBu_r" if sign < 0 else "RdBu"
        im = ax.imshow(
            grid,
            origin="lower",
            aspect="auto",
            cmap=cmap,
            norm=LogNorm(vmin=float(np.exp(-span)), vmax=float(np.exp(span))),
        )
        for i in range(len(budgets)):
            for j in range(len(rates)):
                v = grid[i, j]
                if not np.isfinite(v):
                    continue
                strong = abs(np.log(v)) > 0.6 * span
                ax.text(
                    j,
                    i,
                    ("≈" if tie[i, j] else "") + f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="0.45" if tie[i, j] else ("white" if strong else "black"),
                    style="italic" if tie[i, j] else "normal",
                )
                mark_regimes(ax, [j + 0.36], [i + 0.3], [regime[i][j]])
        ax.set_xticks(range(len(rates)))
        ax.set_xticklabels([f"{x:g}" for x in rates])
        ax.set_yticks(range(len(budgets)))
        ax.set_yticklabels([f"{b // 1024}k" for b in budgets])
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("KV budget per worker (tokens)")
        ax.set_title(title)
        ax.grid(False)
        cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
        lo, hi = float(np.exp(-span)), float(np.exp(span))
        cb.set_ticks([t for t in np.unique(np.round(np.geomspace(lo, hi, 5), 2)) if lo <= t <= hi])
        cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2f}"))
        cb.ax.yaxis.set_minor_formatter(NullFormatter())
        cb.ax.tick_params(labelsize=6)
    fig.suptitle(TITLE, fontsize=9)
    marks = regime_legend_handles(r[REGIME])
    if marks:
        fig.legend(handles=marks, loc="upper right", ncol=len(marks), frameon=False, bbox_to_anchor=(1.0, 0.99))
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    caption = caption_text(df, r)
    add_caption(fig, caption, width_chars=int(5.2 * len(PANELS) * 17))
    paths = save_figure(fig, figures_dir, NAME)
    paths.append(
        write_text(figures_dir, f"{NAME}.csv", r.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    )
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths


def caption_text(df: pd.DataFrame, r: pd.DataFrame) -> str:
    parts = [f"{TITLE}.", captions.provenance_caption(df, [SYSTEM, RATE, BUDGET])]
    for title, _, _, _metric, _ in PANELS:
        p = r[r["panel"] == title]
        holds = int((p["paper_direction"] & ~p["tie"]).sum())
        ties = int(p["tie"].sum())
        parts.append(f"{title}: the paper's direction in {holds} of {len(p)} cells, {ties} ties within noise.")
    parts.append(
        "Each cell: ratio of seed means, log colour scale centred at 1, blue = the paper's direction "
        "(lower latency for LBGR+RLT, higher hit rate for RLT), red = the opposite; '≈' in grey italics = "
        "the per-seed difference is within 2 standard errors over seeds (a tie; the claims table's rule). "
        "Cache-aware router: the rule in each cell's config (router.generation: v0_3_2 = sglang-router 0.3.2 "
        "for CacheAware, smg_1_13 = smg 1.13.0 for CacheAware(smg))."
    )
    parts.append(
        f"Where {PANELS[0][1]} trails {PANELS[0][2]} and why (its predictions against each request's "
        f"realised queue wait, prefill and decode): {WHY_COMMAND} (results_analysis/lbgr_highload/table.md; "
        "claims note [lbgr-load])."
    )
    parts.append(REGIME_NOTE.replace("point", "cell (either system of the ratio)", 1))
    return " ".join(parts)
