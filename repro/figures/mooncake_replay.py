"""Beyond the paper: the Mooncake FAST'25 conversation trace (Kimi production traffic) replayed.

results/mooncake_replay/ (grid: policy = the six systems + Dynamo, llm-d, power-of-two; the whole
trace at its own timestamps, Llama-3.1-8B on H100, 8 workers, KV budget from the memory formula).
Top row: Fig. 2's six metric panels, one bar per system. Bottom row: request latency and TTFT
over the trace (P95 per 2-minute arrival window), one line per system, so that load bursts
and how each router rides them are visible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repro.figures.load import METRICS, SYSTEM, ResultsError
from repro.results.store import CellStore
from repro.figures.perf import LOG_SPAN, PerfFigure, line_style, log_axis, wide_range
from repro.figures.style import (
    LOG_METRICS,
    METRIC_LABELS,
    add_caption,
    apply_style,
    save_figure,
    system_colors,
    system_order,
    write_text,
    title_and_legend,
)

WINDOW_S = 120.0
QUANTILE = 0.95
TIME_PANELS = (("latency_s", "P95 latency (s) per 2-min window"), ("ttft_s", "P95 TTFT (s) per 2-min window"))

FIGURE = PerfFigure(
    name="mooncake_replay",
    exp="mooncake_replay",
    title="Beyond the paper: the Mooncake production trace replayed on nine routers",
    kind="bars",
    facets=(),
    notes="Bars in system order: the six systems of Fig. 2, then Dynamo+LRU, llm-d+LRU, PowerOfTwo+LRU. "
    "Prompts are the trace's 512-token hash blocks turned into token ids (the same hash id = the same "
    "ids), so hits are exactly the trace's reusable prefixes. Bottom row: P95 latency and TTFT of "
    f"the requests arriving in each {WINDOW_S:g}-s window of the trace.",
)
NAME, EXP = FIGURE.name, FIGURE.exp


def over_time(results_dir: str | Path, cells: pd.DataFrame) -> pd.DataFrame:
    """Per system and arrival window: P95 latency and TTFT (the first cell of a system by signature)."""
    rows = []
    for system, part in cells.groupby(SYSTEM, sort=False):
        sig = sorted(part["signature"])[0]
        path = CellStore(results_dir, EXP, sig).path(CellStore.REQUESTS)
        if not path.is_file():
            raise ResultsError(f"{path} is missing (needed for the latency-over-time row)")
        r = pd.read_parquet(path, columns=["arrival_s", "first_token_s", "finish_s", "failed"])
        r = r[~r["failed"]]
        w = np.floor(r["arrival_s"].to_numpy() / WINDOW_S).astype(np.int64)
        d = pd.DataFrame(
            {"window": w, "latency_s": r["finish_s"] - r["arrival_s"], "ttft_s": r["first_token_s"] - r["arrival_s"]}
        )
        g = d.groupby("window").quantile(QUANTILE)
        g["requests"] = d.groupby("window").size()
        g[SYSTEM] = system
        g["t_min"] = (g.index.to_numpy() + 0.5) * WINDOW_S / 60.0
        rows.append(g.reset_index())
    return pd.concat(rows, ignore_index=True)


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    df, agg = FIGURE.table(results_dir)
    ts = over_time(results_dir, df)
    apply_style()
    systems = system_order(agg[SYSTEM])
    colors = system_colors(systems)
    n_cols = len(METRICS)
    fig = plt.figure(figsize=(2.25 * n_cols, 2.0 * 2 + 0.6))
    grid = fig.add_gridspec(2, n_cols)
    for c, metric in enumerate(METRICS):
        ax = fig.add_subplot(grid[0, c])
        FIGURE._bars(ax, agg, metric, systems, colors)
        ax.set_title(METRIC_LABELS[metric])
        if metric in LOG_METRICS and wide_range(agg, metric):
            log_axis(ax)
            ax.set_ylim(bottom=float(np.nanmin(agg[metric].to_numpy(dtype=float))) / 3)
    half = n_cols // 2
    for k, (col, label) in enumerate(TIME_PANELS):
        ax = fig.add_subplot(grid[1, k * half : (k + 1) * half])
        for s in systems:
            line = ts[ts[SYSTEM] == s].sort_values("t_min")
            ax.plot(line["t_min"], line[col], color=colors[s], **{**line_style(s, systems), "ms": 2.0})
        vals = ts[col].to_numpy(dtype=float)
        vals = vals[np.isfinite(vals) & (vals > 0)]
        if len(vals) > 1 and vals.max() / vals.min() > LOG_SPAN:
            log_axis(ax)
        ax.set_xlabel("trace time (min)")
        ax.set_title(label)
    handles = [Patch(facecolor=colors[s], label=s) for s in systems]
    title_and_legend(fig, FIGURE.title, handles, ncol=min(len(systems), 9))
    caption = FIGURE.caption(df)
    add_caption(fig, caption, width_chars=int(2.25 * n_cols * 17))
    paths = save_figure(fig, figures_dir, NAME)
    paths.append(write_text(figures_dir, f"{NAME}.csv", FIGURE.csv(agg)))
    paths.append(
        write_text(
            figures_dir,
            f"{NAME}_over_time.csv",
            ts[[SYSTEM, "window", "t_min", "requests", "latency_s", "ttft_s"]].to_csv(
                index=False, float_format="%.6g", lineterminator="\n"
            ),
        )
    )
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths
