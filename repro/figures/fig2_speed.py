"""The unknown hardware speed (beyond the paper; issue 39): the four Fig. 2 numbers of LBGR+RLT vs
CacheAware+LRU (P50 latency ×, P50 TTFT ×, hit rate and throughput changes) on the artifact
protocol's GSP cells against the L40 speed factor (conf/exp/fig2_speed.yaml; every step time /
hardware.speed_factor), with the range of the per-seed ratios and the paper's number as a line.
The caption says at which speed factors all four are within the claims' band of the paper's.

Systems are named by the paper: a cell's policy_name goes through its own `protocol.paper_names`
(so CacheAware014+LRU -> CacheAware+LRU), and a policy_name that already is a paper name stays.
Writes figures/fig2_speed.png/.pdf/.csv and .caption.txt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repro.figures import captions
from repro.figures.gap_ladder import BASE, LOWER, METRICS, OURS, RATIO_LABELS, SHORT, fmt_ratio, paper_numbers, ratios
from repro.figures.load import SYSTEM as POLICY_NAME
from repro.figures.load import ResultsError, load_cells, require
from repro.figures.style import add_caption, apply_style, save_figure, write_text

NAME = EXP = "fig2_speed"
TITLE = "The unknown hardware speed: the four Fig. 2 GSP numbers against the L40 speed factor (beyond the paper)"
SPEED = "hardware.speed_factor"
SYSTEM = "system"
PAPER_NAMES = "protocol.paper_names"


def within(metric: str, ours: float, paper: float) -> bool:
    """The claims' numeric rule (claims_verdict.numeric): the paper's direction and within its band."""
    from repro.figures.claims_verdict import FACTOR_BAND

    if not np.isfinite(ours):
        return False
    if metric in LOWER:  # factors: compare the factors
        return ours > 1 and 1 / FACTOR_BAND <= ours / paper <= FACTOR_BAND
    return np.sign(ours) == np.sign(paper) and 1 / FACTOR_BAND <= ours / paper <= FACTOR_BAND


def paper_system(row: pd.Series) -> str:
    names = row.get(PAPER_NAMES)
    mapping = dict(names) if isinstance(names, tuple) and names else {}
    return str(mapping.get(row[POLICY_NAME], row[POLICY_NAME]))


def table(results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, one row per speed factor): each metric's ratio of seed means and per-seed range."""
    df = require(load_cells(results_dir, EXP), EXP, [SPEED, POLICY_NAME, *METRICS])
    df[SYSTEM] = df.apply(paper_system, axis=1)
    df = df[df[SYSTEM].isin((BASE, OURS))]
    if df.empty:
        raise ResultsError(f"results/{EXP}/: no {BASE} or {OURS} cells")
    rows = []
    for speed, g in df.groupby(SPEED, sort=True):
        b, o = g[g[SYSTEM] == BASE], g[g[SYSTEM] == OURS]
        for part, system in ((b, BASE), (o, OURS)):
            if part["seed"].duplicated().any():
                raise ResultsError(
                    f"results/{EXP}/: cells {sorted(part['signature'])} repeat a seed of {system} at "
                    f"speed {speed} (two settings in one folder)"
                )
        row: dict = {SPEED: float(speed), "n_seeds": min(len(b), len(o))}
        for metric in METRICS:
            r = ratios(b, o, metric)
            row.update({f"{metric}_ratio": r["ratio"], f"{metric}_lo": r["lo"], f"{metric}_hi": r["hi"]})
        rows.append(row)
    return df, pd.DataFrame(rows)


def together(out: pd.DataFrame) -> list[float]:
    """The speed factors at which all four ratios agree with the paper's numbers."""
    paper = paper_numbers()
    return [float(r[SPEED]) for _, r in out.iterrows() if all(within(m, r[f"{m}_ratio"], paper[m]) for m in METRICS)]


def caption_text(df: pd.DataFrame, out: pd.DataFrame) -> str:
    from repro.figures.claims_verdict import FACTOR_BAND

    paper = paper_numbers()
    hits = together(out)
    where = (
        "all four agree with the paper's at speed factor(s) " + ", ".join(f"{s:g}" for s in hits)
        if hits
        else "at no swept speed factor do all four agree with the paper's"
    )
    per = []
    for m in METRICS:
        ok = [f"{r[SPEED]:g}" for _, r in out.iterrows() if within(m, r[f"{m}_ratio"], paper[m])]
        per.append(f"{SHORT[m]} (paper {fmt_ratio(m, paper[m])}): {', '.join(ok) or 'none'}")
    return (
        f"The unknown hardware speed: {OURS} vs {BASE} on the artifact protocol's Fig. 2 GSP cells against "
        "the L40 speed factor (step times / factor; 1 = the H200 fit scaled by the datasheet). Points: the ratio "
        "of the seed means; bars: the range of the per-seed ratios; dashed: the paper's Fig. 2 number (a mean "
        f"over four benchmarks). Agreement = the claims' rule (the paper's direction, within ×{FACTOR_BAND:g} "
        f"of its number): {where}. Per number, the speed factors that agree: "
        + "; ".join(per)
        + ". "
        + captions.provenance_caption(df, [SPEED, SYSTEM])
    )


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib.pyplot as plt

    df, out = table(results_dir)
    apply_style()
    paper = paper_numbers()
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 2.8), squeeze=False)
    x = out[SPEED].to_numpy(dtype=float)
    for c, metric in enumerate(METRICS):
        ax = axes[0][c]
        scale = 1.0 if metric in LOWER else 100.0
        r = out[f"{metric}_ratio"].to_numpy(dtype=float)
        lo, hi = out[f"{metric}_lo"].to_numpy(dtype=float), out[f"{metric}_hi"].to_numpy(dtype=float)
        # the seed range as a bar of its own: the ratio of the means may lie outside it
        ax.vlines(x, lo * scale, hi * scale, color="black", lw=1)
        ax.plot(x, r * scale, marker="o", ms=3.5, color="black", label=f"{OURS} vs {BASE}")
        ax.axhline(paper[metric] * scale, ls="--", color="tab:red", lw=1, label="paper (Fig. 2)")
        ax.axhline(1.0 if metric in LOWER else 0.0, ls=":", color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [f"{v:g}" for v in x])
        ax.minorticks_off()
        ax.set_xlabel("L40 speed factor")
        ax.set_title(RATIO_LABELS[metric] + ("" if metric in LOWER else " (%)"))
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Fig. 2 GSP numbers against the unknown L40 speed (artifact protocol)", fontsize=9)
    caption = caption_text(df, out)
    add_caption(fig, caption, width_chars=int(3.2 * len(METRICS) * 17))
    paths = save_figure(fig, figures_dir, NAME)
    paths.append(write_text(figures_dir, f"{NAME}.csv", out.to_csv(index=False, float_format="%.6g")))
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths
