"""figures/thm_competitive_ratio.png|pdf: misses per phase vs B - L (+ beta) for L-LRU, RLT and OPT.

Reads results/thm_competitive_ratio/<sig>/summary.json only (written by
`python -m repro.theory.competitive_ratio`). Panel (a): Theorem 4 construction, x = B - L + 1;
panel (b): Theorem 5 (batched) construction, x = B - L - beta + 2. Reference curves x (L-LRU's
bound) and H_x (RLT's expectation); OPT is 1. Token granularity only. When several result
cells share (construction, policy, x), the one with the most measured phases x runs wins.

    python -m repro.figures.thm_competitive_ratio [--results-dir results] [--figures-dir figures]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

EXP = "thm_competitive_ratio"
NAME = "thm_competitive_ratio"
LABELS = {"lru": "L-LRU", "rlt": "RLT (mean, 95% CI)", "opt": "OPT"}
PANELS = (  # (construction, title, x as mathtext)
    ("thm4", "(a) Theorem 4 construction, single query", "B-L+1"),
    ("thm5", "(b) Theorem 5 construction, batched", "B-L-\\beta+2"),
)


def load(results_dir: str | Path) -> pd.DataFrame:
    rows = []
    from repro.figures.load import ResultsError
    from repro.results.store import CellStore

    for summary in sorted(Path(results_dir, EXP).glob("*/summary.json")):
        store = CellStore.at(summary.parent)
        integrity, why = store.integrity()
        if integrity == "damaged":  # never plotted
            raise ResultsError(f"{store.dir}: damaged ({'; '.join(why)}); rerun its experiment or delete the folder")
        s = store.read_summary()
        s["signature"] = summary.parent.name
        rows.append(s)
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df = df[df["granularity"] == "token"]
    df["weight"] = df["num_runs"] * df["phases_measured"]
    df = df.sort_values(
        ["construction", "policy", "x", "weight", "signature"], ascending=[True, True, True, False, True]
    )
    return df.drop_duplicates(["construction", "policy", "x"], keep="first").reset_index(drop=True)


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    from repro.figures.style import apply_style, plt, save_figure

    df = load(results_dir)
    if df.empty:
        raise FileNotFoundError(
            f"no results under {Path(results_dir, EXP)}: run `python -m repro.theory.competitive_ratio` first"
        )
    apply_style()
    panels = [p for p in PANELS if (df["construction"] == p[0]).any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    colors = {"lru": "C3", "rlt": "C0", "opt": "C2"}
    for ax, (cons, title, xlabel) in zip(axes[0], panels):
        d = df[df["construction"] == cons]
        xs = np.array(sorted(d["x"].unique()), dtype=float)
        for pol in ("lru", "rlt", "opt"):
            p = d[d["policy"] == pol].sort_values("x")
            if p.empty:
                continue
            ax.plot(p["x"], p["misses_per_phase"], marker="o", ms=3.5, lw=1.4, color=colors[pol], label=LABELS[pol])
            if pol == "rlt":
                ax.fill_between(p["x"], p["ci95_low"], p["ci95_high"], color=colors[pol], alpha=0.25, lw=0)
        # reference curves on top (the measured lines coincide with them)
        ax.plot(xs, xs, ls="--", color="k", lw=0.9, zorder=5, label=f"${xlabel}$ (L-LRU bound)")
        ax.plot(
            xs,
            [sum(1.0 / i for i in range(1, int(x) + 1)) for x in xs],
            ls=":",
            color="k",
            lw=1.1,
            zorder=5,
            label=f"$H_{{{xlabel}}}$",
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel(f"${xlabel}$")
        ax.set_ylabel("misses per phase (steady state)")
        params = ", ".join(
            f"${sym}={int(d[col].iloc[0])}$"
            for sym, col in (("L", "min_path_len"), ("\\beta", "beta"))
            if d[col].nunique() == 1 and not (col == "beta" and cons == "thm4")
        )
        ax.set_title(f"{title} ({params})" if params else title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Misses per phase — single worker, replayer, token granularity", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, figures_dir, NAME)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="render figures/thm_competitive_ratio.png|pdf from results/")
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--figures-dir", default="figures")
    a = ap.parse_args(argv)
    for p in render(a.results_dir, a.figures_dir):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
