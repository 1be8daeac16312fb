"""Load ladder (beyond the paper): P50 latency and P50 TTFT of the six systems against the request
rate, from light load to about twice saturation, on GSP and ShareGPT (one column per workload),
every point marked with its load regime (summary.json `regime`: ring = backlogged, × =
overloaded; docs/ALGORITHMS.md §5). The way llm-d and Dynamo report routing results: a comparison
means something only together with the load it was made at.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repro.figures import captions
from repro.figures.load import REGIME, SYSTEM
from repro.figures.perf import PerfFigure, counted, line_style, log_axis
from repro.figures.style import (
    METRIC_LABELS,
    REGIME_NOTE,
    add_caption,
    apply_style,
    regime_legend_handles,
    save_figure,
    system_colors,
    system_order,
    write_text,
    title_and_legend,
)

RATE, WORKLOAD = "workload.request_rate", "workload.name"
PANEL_METRICS = ("latency_p50_s", "ttft_p50_s")
FIGURE = PerfFigure(
    name="load_ladder",
    exp="load_ladder",
    title="Load ladder: P50 latency and TTFT of the six systems from light load to twice saturation (beyond the paper)",
    kind="sweep",
    x=RATE,
    x_label="request rate (req/s)",
    x_log=2,
)
NAME, EXP = FIGURE.name, FIGURE.exp


def table(results_dir: str | Path):
    """(cells, aggregated points, point keys) — what the plot and the claims engine read."""
    df, agg = FIGURE.table(results_dir)
    return df, agg, FIGURE.point_keys(df)


def first_unstable(agg: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{workload: {system: the lowest rate whose point is not stable}} (systems stable throughout left out)."""
    out: dict[str, dict[str, float]] = {}
    for (wl, system), g in agg.groupby([WORKLOAD, SYSTEM], sort=False):
        bad = g.loc[g[REGIME].isin(("backlogged", "overloaded")), RATE]
        if len(bad):
            out.setdefault(str(wl), {})[str(system)] = float(bad.min())
    return out


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    df, agg, _ = table(results_dir)
    apply_style()
    workloads = list(dict.fromkeys(agg[WORKLOAD]))
    systems = system_order(agg[SYSTEM])
    colors = system_colors(systems)
    fig, axes = plt.subplots(
        len(PANEL_METRICS), len(workloads), figsize=(3.4 * len(workloads), 2.3 * 2 + 0.5), squeeze=False
    )
    for c, wl in enumerate(workloads):
        part = agg[agg[WORKLOAD] == wl]
        for r, metric in enumerate(PANEL_METRICS):
            ax = axes[r][c]
            FIGURE._sweep(ax, part, metric, systems, colors, log_y=True)
            vals = part[metric].to_numpy(dtype=float)
            vals = vals[np.isfinite(vals) & (vals > 0)]
            if len(vals):
                log_axis(ax, float(vals.min()), float(vals.max()))
            ax.set_title(f"{wl}: {METRIC_LABELS[metric]}")
            if r < len(PANEL_METRICS) - 1:
                ax.set_xlabel("")
    handles = [Line2D([0], [0], color=colors[s], label=s, **line_style(s, systems)) for s in systems]
    handles += regime_legend_handles(agg[REGIME])
    title_and_legend(fig, counted(FIGURE.title, systems), handles, ncol=4, head_in=0.85, legend_in=0.24)
    caption = caption_text(df, agg)
    add_caption(fig, caption, width_chars=int(3.4 * len(workloads) * 17))
    paths = save_figure(fig, figures_dir, NAME)
    paths.append(write_text(figures_dir, f"{NAME}.csv", FIGURE.csv(agg)))
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths


def caption_text(df: pd.DataFrame, agg: pd.DataFrame) -> str:
    systems = system_order(agg[SYSTEM])
    parts = [f"{counted(FIGURE.title, systems)}.", captions.provenance_caption(df, FIGURE.point_keys(df))]
    firsts = first_unstable(agg)
    for wl in dict.fromkeys(agg[WORKLOAD]):
        got = firsts.get(str(wl), {})
        said = [f"{s} {got[s]:g}" for s in system_order(got)]
        stable = [s for s in systems if s not in got]
        parts.append(
            f"{wl}, the first rate (req/s) at which a system is not stable: "
            + (", ".join(said) or "none")
            + (f"; stable throughout: {', '.join(stable)}" if stable else "")
            + "."
        )
    parts.append(REGIME_NOTE)
    parts.append(
        "Log axes (x base 2); points of neighbouring systems are shifted slightly sideways so that equal "
        "values stay visible (ticks mark the true rate)."
    )
    return " ".join(parts)
