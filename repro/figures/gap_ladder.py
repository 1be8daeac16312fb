"""The gap taken apart (beyond the paper; issue 39): Fig. 2 GSP at 12 req/s, from the text protocol
(r0) to the artifact protocol (r6) one factor at a time (conf/exp/gap_ladder.yaml, conf/ladder/),
LBGR+RLT vs CacheAware+LRU: per rung each system's P50 latency, P50 TTFT, hit rate and throughput
(mean ± SD over seeds) and the LBGR+RLT / CacheAware+LRU ratios with their seed range.

Cells are grouped by `ladder.rung` and the paper system (`ladder.side`: baseline = CacheAware+LRU,
ours = LBGR+RLT), never by policy_name (which differs from rung to rung). A rung whose factor
leaves one system unchanged has no cell for it: the previous rung's stands (`carried_from`).
Writes figures/gap_ladder.png/.pdf/.csv/.md and .caption.txt. fig2_speed reuses `ratios`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from repro.figures import captions
from repro.figures.load import PROTOCOL, SEED, ResultsError, aggregate, load_cells, require
from repro.figures.style import METRIC_LABELS, add_caption, apply_style, save_figure, system_colors, write_text

# its rungs go from the text protocol (r0-r5) to the artifact protocol (r6): one figure over both
SPANS_PROTOCOLS = True

NAME = EXP = "gap_ladder"
TITLE = "The gap taken apart: Fig. 2 GSP from the text protocol to the artifact protocol, one factor per rung (beyond the paper)"
RUNG, SIDE, FACTOR = "ladder.rung", "ladder.side", "ladder.factor"
SYSTEM = "system"  # the paper's name of a cell's system (this module's column)
BASE, OURS = "CacheAware+LRU", "LBGR+RLT"
SIDES = {"baseline": BASE, "ours": OURS}
METRICS = ("latency_p50_s", "ttft_p50_s", "hit_rate", "throughput_rps")
LOWER = ("latency_p50_s", "ttft_p50_s")  # ratio base / ours; the others: ours / base - 1
# The four Fig. 2 numbers (claims_catalogue.yaml): metric -> claim id
PAPER_CLAIMS = {
    "latency_p50_s": "fig2.p50_latency_vs_ca",
    "ttft_p50_s": "fig2.p50_ttft_vs_ca",
    "hit_rate": "fig2.hit_vs_ca",
    "throughput_rps": "fig2.tput_vs_ca",
}
SHORT = {
    "latency_p50_s": "P50 latency",
    "ttft_p50_s": "P50 TTFT",
    "hit_rate": "hit rate",
    "throughput_rps": "throughput",
}
RATIO_LABELS = {
    "latency_p50_s": "P50 latency ×",
    "ttft_p50_s": "P50 TTFT ×",
    "hit_rate": "hit rate Δ",
    "throughput_rps": "throughput Δ",
}


def paper_numbers() -> dict[str, float]:
    """{metric: the paper's Fig. 2 number} (a factor for latency/TTFT, a relative change otherwise)."""
    from repro.figures.claims_catalogue import CATALOGUE_FILE, paper_number

    entries = {e["id"]: e for e in yaml.safe_load(CATALOGUE_FILE.read_text())["claims"]}
    out = {}
    for metric, cid in PAPER_CLAIMS.items():
        sign, value, unit = paper_number(str(entries[cid]["paper"]))
        out[metric] = float(sign * value) / (100.0 if unit == "%" else 1.0)
    return out


def improvement(metric: str, base, ours):
    """× for lower-is-better metrics (base / ours), relative change otherwise (as the claims use)."""
    base, ours = np.asarray(base, dtype=float), np.asarray(ours, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return base / ours if metric in LOWER else ours / base - 1.0


def fmt_ratio(metric: str, v: float) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:.2f}×" if metric in LOWER else f"{v * 100:+.1f} %"


def ratios(base: pd.DataFrame, ours: pd.DataFrame, metric: str) -> dict:
    """Ratio of the seed means and the range of the per-seed ratios (cells paired by seed)."""
    b = base.set_index(SEED)[metric].astype(float)
    o = ours.set_index(SEED)[metric].astype(float)
    seeds = sorted(set(b.index) & set(o.index))
    if not seeds:
        return {"ratio": np.nan, "lo": np.nan, "hi": np.nan, "n": 0}
    per = improvement(metric, b.loc[seeds].to_numpy(), o.loc[seeds].to_numpy())
    return {
        "ratio": float(improvement(metric, b.loc[seeds].mean(), o.loc[seeds].mean())),
        "lo": float(np.min(per)),
        "hi": float(np.max(per)),
        "n": len(seeds),
    }


def cells(results_dir: str | Path) -> pd.DataFrame:
    df = require(load_cells(results_dir, EXP), EXP, [RUNG, SIDE, *METRICS])
    bad = sorted(set(df[SIDE]) - set(SIDES))
    if bad:
        raise ResultsError(f"results/{EXP}/: unknown ladder.side {bad} (expected {sorted(SIDES)})")
    df[SYSTEM] = df[SIDE].map(SIDES)
    return df


def rung_order(df: pd.DataFrame) -> list[str]:
    return sorted(dict.fromkeys(df[RUNG]), key=lambda r: (len(str(r)), str(r)))


def table(results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, one row per rung x system): mean/SD per metric, n_seeds, `carried_from` (the rung
    whose cells stand for a system this rung leaves unchanged, else the rung itself), and the
    rung's ratios (`<metric>_ratio`, `_lo`, `_hi`) on the LBGR+RLT rows."""
    df = cells(results_dir)
    agg = aggregate(df, [RUNG, SYSTEM, PROTOCOL], EXP, METRICS)  # each rung is of one protocol
    factors = df.groupby(RUNG)[FACTOR].first().to_dict() if FACTOR in df else {}
    rows, last = [], {}
    for rung in rung_order(df):
        for system in (BASE, OURS):
            got = agg[(agg[RUNG] == rung) & (agg[SYSTEM] == system)]
            if len(got):
                last[system] = (rung, got.iloc[0].to_dict())
            if system not in last:
                raise ResultsError(f"results/{EXP}/: no {system} cells at or before rung {rung}")
            src, row = last[system]
            rows.append({**row, RUNG: rung, SYSTEM: system, "carried_from": src, "factor": factors.get(rung, "")})
    out = pd.DataFrame(rows)
    for metric in METRICS:
        for k in ("ratio", "lo", "hi"):
            out[f"{metric}_{k}"] = np.nan
    for rung in rung_order(df):
        src = out[out[RUNG] == rung].set_index(SYSTEM)["carried_from"]
        b = df[(df[RUNG] == src[BASE]) & (df[SYSTEM] == BASE)]
        o = df[(df[RUNG] == src[OURS]) & (df[SYSTEM] == OURS)]
        at = (out[RUNG] == rung) & (out[SYSTEM] == OURS)
        for metric in METRICS:
            r = ratios(b, o, metric)
            for k in ("ratio", "lo", "hi"):
                out.loc[at, f"{metric}_{k}"] = r[k]
    return df, out


def _mean_sd(row, metric: str) -> str:
    m, sd = row[metric], row[f"{metric}_sd"]
    return f"{m:.3g} ± {sd:.2g}" if metric != "hit_rate" else f"{m * 100:.1f} ± {sd * 100:.1f}"


def markdown(out: pd.DataFrame, caption: str) -> str:
    cols = ["rung", "factor added"]
    for metric in METRICS:
        cols += [f"{METRIC_LABELS.get(metric, metric)} {BASE}", f"{OURS}", RATIO_LABELS[metric]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rung, g in out.groupby(RUNG, sort=False):
        g = g.set_index(SYSTEM)
        cells_ = [str(rung), str(g.loc[OURS, "factor"])]
        for metric in METRICS:
            b, o = g.loc[BASE], g.loc[OURS]
            mark = {s: f" (={g.loc[s, 'carried_from']})" if g.loc[s, "carried_from"] != rung else "" for s in g.index}
            r, lo, hi = (o[f"{metric}_{k}"] for k in ("ratio", "lo", "hi"))
            spread = f" [{fmt_ratio(metric, lo)}, {fmt_ratio(metric, hi)}]" if np.isfinite(lo) else ""
            cells_ += [
                _mean_sd(b, metric) + mark[BASE],
                _mean_sd(o, metric) + mark[OURS],
                fmt_ratio(metric, r) + spread,
            ]
        lines.append("| " + " | ".join(cells_) + " |")
    return f"{caption}\n\n" + "\n".join(lines) + "\n"


def caption_text(df: pd.DataFrame, out: pd.DataFrame) -> str:
    paper = paper_numbers()
    said = ", ".join(f"{SHORT[m]} {fmt_ratio(m, v)}" for m, v in paper.items())
    return (
        "The gap taken apart: Fig. 2 GSP at 12 req/s from the text protocol (r0) to the authors' artifact "
        f"protocol (r6), one factor per rung, {OURS} vs {BASE} (mean ± SD over seeds; ratios: of the seed "
        "means, [the range of the per-seed ratios]; × = baseline / ours, Δ = ours / baseline − 1). "
        "(=rN): the system is unchanged by this rung's factor, rung rN's cells stand for it. "
        f"The paper's Fig. 2 (mean over four benchmarks): {said}. " + captions.provenance_caption(df, [RUNG, SYSTEM])
    )


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib.pyplot as plt

    df, out = table(results_dir)
    apply_style()
    rungs = list(dict.fromkeys(out[RUNG]))
    x = np.arange(len(rungs))
    colors = system_colors([BASE, OURS])
    paper = paper_numbers()
    fig, axes = plt.subplots(2, len(METRICS), figsize=(3.3 * len(METRICS), 5.4), squeeze=False)
    for c, metric in enumerate(METRICS):
        ax = axes[0][c]
        for k, system in enumerate((BASE, OURS)):
            g = out[out[SYSTEM] == system].set_index(RUNG).loc[rungs]
            unit = 100.0 if metric == "hit_rate" else 1.0  # METRIC_LABELS: the hit rate in %
            ax.errorbar(
                x + (k - 0.5) * 0.12,
                g[metric] * unit,
                yerr=g[f"{metric}_sd"] * unit,
                marker="o",
                ms=3.5,
                capsize=2,
                color=colors[system],
                label=system,
            )
        if metric in LOWER:
            ax.set_yscale("log")
        ax.set_title(METRIC_LABELS.get(metric, metric))
        ax = axes[1][c]
        g = out[out[SYSTEM] == OURS].set_index(RUNG).loc[rungs]
        r = g[f"{metric}_ratio"].to_numpy(dtype=float)
        lo, hi = g[f"{metric}_lo"].to_numpy(dtype=float), g[f"{metric}_hi"].to_numpy(dtype=float)
        scale = 1.0 if metric in LOWER else 100.0
        # the seed range as a bar of its own: the ratio of the means may lie outside it
        ax.vlines(x, lo * scale, hi * scale, color="black", lw=1)
        ax.plot(x, r * scale, marker="s", ms=3.5, color="black", label="ours vs baseline")
        ax.axhline(paper[metric] * scale, ls="--", color="tab:red", lw=1, label="paper (Fig. 2)")
        ax.axhline(1.0 if metric in LOWER else 0.0, ls=":", color="grey", lw=0.8)
        ax.set_ylabel(RATIO_LABELS[metric] + ("" if metric in LOWER else " (%)"))
        for row in axes:
            row[c].set_xticks(x, rungs)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle("The gap taken apart: text protocol (r0) → artifact protocol (r6), Fig. 2 GSP", fontsize=9)
    caption = caption_text(df, out)
    factors = "; ".join(f"{r}: {f}" for r, f in zip(rungs, out[out[SYSTEM] == OURS]["factor"]))
    add_caption(fig, f"Rungs: {factors}. " + caption, width_chars=int(3.3 * len(METRICS) * 17))
    paths = save_figure(fig, figures_dir, NAME)
    keep = [RUNG, "factor", SYSTEM, "carried_from", "n_seeds", "seeds"]
    keep += [f"{m}{s}" for m in METRICS for s in ("", "_sd", "_ratio", "_lo", "_hi")]
    paths.append(write_text(figures_dir, f"{NAME}.csv", out[keep].to_csv(index=False, float_format="%.6g")))
    paths.append(write_text(figures_dir, f"{NAME}.md", markdown(out, caption)))
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths
