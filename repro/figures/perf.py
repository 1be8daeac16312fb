"""The shared shape of the performance figures: six metric panels per row, one row per facet.

A `PerfFigure` is what each figure module declares (its experiment, what the x axis is, what
makes a row, its title and the reconstruction notes); `render` reads results/<exp>/ through
repro.figures.load, checks the cells pool cleanly over seeds, and writes

    figures/<name>.png, .pdf   the plot (caption with provenance under it)
    figures/<name>.csv         the plotted numbers (mean and SD per point), for readers
    figures/<name>.caption.txt the caption text

kind "bars": one bar per system (fig2/3/4); kind "sweep": x = a swept config field, one line
per system (fig5-7, 10-14). Error bars / bands are ± one sample SD over seeds (none for one
seed). A system whose cells lack the x field (e.g. Cache-Aware in the decay-interval sweep)
is drawn as a dotted horizontal reference line.

Readability rules of the sweeps (the four close systems otherwise lie on top of each other):
every system has its own marker and line style (RLT variants hollow markers), and its points
are shifted sideways by a small fixed dodge (DODGE of the x step, in system order; the tick
stays on the true x). Scales: the four latency / TTFT panels of one figure share ONE scale
rule — all logarithmic when the values of any of them span more than LOG_SPAN, else all
linear — so a P50 and a P95 panel are never on different kinds of axis. Hit rate and
throughput are linear from 0 with headroom above the largest value, and markers are not
clipped at the panel edges. Log axes get 1-2-5 ticks, and 3, 4, 6-9 where a panel spans little,
each only where its label keeps LABEL_GAP of the panel's height from the others (log_ticks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from repro.figures import captions
from repro.figures.knobs import knob_label
from repro.figures.load import METRICS, SYSTEM, aggregate, load_cells, require
from repro.figures.style import (
    LOG_METRICS,
    METRIC_LABELS,
    PAPER_SYSTEMS,
    REGIME_NOTE,
    add_caption,
    apply_style,
    mark_regimes,
    regime_legend_handles,
    save_figure,
    system_colors,
    system_order,
    write_text,
    title_and_legend,
)

PERCENT_METRICS = ("hit_rate",)
# Facet rows in the paper's order where it has one; anything else sorts after, by name.
FACET_ORDER = {
    "workload.name": ("gsp", "sharegpt", "ultrachat", "loogle"),
    "model.name": ("llama31_8b", "llama31_70b", "mixtral_8x7b"),
}


def _facet_rank(col: str, v) -> tuple:
    known = FACET_ORDER.get(col, ())
    return (known.index(v), "") if v in known else (len(known), str(v))


def metric_values(metric: str, values):
    """Display units: hit rate in %, everything else as stored (s, req/s)."""
    return np.asarray(values, dtype=float) * (100.0 if metric in PERCENT_METRICS else 1.0)


LOG_SPAN = 10.0  # the time panels of a figure get log axes when any of them spans more than this factor
DODGE = 0.12  # sideways shift between neighbouring systems, as a fraction of the smallest x step
HEADROOM = 1.08  # linear panels: top = largest value x this


def wide_range(part: pd.DataFrame, metric: str) -> bool:
    vals = part[metric].to_numpy(dtype=float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    return len(vals) > 1 and vals.max() / vals.min() > LOG_SPAN


def log_time_panels(agg: pd.DataFrame) -> bool:
    """One scale for all latency / TTFT panels of a figure: log if any of them spans > LOG_SPAN."""
    return any(wide_range(agg, m) for m in LOG_METRICS if m in agg)


MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<")
# Distinct per system (in system order): solid, dashed, dash-dot, dotted, long dash, dash-dot-dot.
LINESTYLES = ("-", (0, (4, 2)), (0, (5, 1.5, 1, 1.5)), (0, (1, 1.2)), (0, (8, 2)), (0, (4, 1.5, 1, 1.5, 1, 1.5)))


def line_style(system: str, systems: list[str]) -> dict:
    """A marker and a line style per system; RLT variants have hollow markers, so that two lines
    lying exactly on each other still show both."""
    i = systems.index(system)
    style = {"marker": MARKERS[i % len(MARKERS)], "ms": 4.0, "lw": 1.2, "ls": LINESTYLES[i % len(LINESTYLES)]}
    if system.endswith("+RLT"):
        style.update(mfc="white", mew=1.1)
    return style


def dodge_offsets(xs, n_systems: int, log_base: int = 0) -> np.ndarray:
    """Per system index, its sideways shift: additive on a linear x axis, multiplicative (a factor)
    on a log axis; DODGE of the smallest step between neighbouring x values."""
    xs = np.unique(np.asarray(xs, dtype=float))
    centred = np.arange(n_systems) - (n_systems - 1) / 2
    if len(xs) < 2:
        return np.zeros(n_systems) if not log_base else np.ones(n_systems)
    if log_base:
        step = float(np.min(np.diff(np.log(xs[xs > 0])))) if (xs > 0).sum() > 1 else 0.0
        return np.exp(centred * DODGE * step / max(n_systems - 1, 1) * 2)
    step = float(np.min(np.diff(xs)))
    return centred * DODGE * step / max(n_systems - 1, 1) * 2


LABEL_GAP = 0.12  # least distance between two labelled log ticks, as a fraction of the axis height
_TICK_PRIORITY = (1, 2, 5, 3, 4, 6, 7, 8, 9)  # the mantissas tried first win a crowded axis
_TICK_TOL = 1e-9  # relative slack at the axis limits and absolute slack (log10) on the gap (log_ticks)


def log_ticks(bottom: float, top: float, gap: float = LABEL_GAP) -> list[float]:
    """Tick values for a log axis from `bottom` to `top`: mantissas 1, 2, 5 first, then 3, 4, 6-9,
    each kept only if it lies at least `gap` of the axis height (in log space) from every tick
    kept so far, so that no two labels overprint (fig13's 0.6 ... 1 did, issue 42)."""
    import math

    lo, hi = math.log10(bottom), math.log10(top)
    span = hi - lo
    # float edges: a tick is in range if within a relative _TICK_TOL of the limits (matplotlib draws
    # ticks that close to the view limits), and the range test is made on the values themselves, not
    # on their logs (log10(999.9999999999999) == 3.0 would let 1000 in while 1000 > top); the gap
    # test allows _TICK_TOL too, on log10 of the ratio, so two equal spacings compare equal.
    kept: list[float] = []
    for m in _TICK_PRIORITY:
        for e in range(math.floor(lo) - 1, math.ceil(hi) + 2):
            v = float(f"{m * 10.0**e:.12g}")
            if bottom * (1 - _TICK_TOL) <= v <= top * (1 + _TICK_TOL) and all(
                abs(math.log10(v / k)) >= gap * span - _TICK_TOL for k in kept
            ):
                kept.append(v)
    return sorted(kept)


def log_axis(ax, lo: float | None = None, hi: float | None = None) -> None:
    """Log y axis labelled in plain numbers: 1-2-5 ticks, more (3, 4, 6-9) when the panel spans
    little, never two labels closer than LABEL_GAP of the panel's height."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    narrow = lo is not None and hi is not None and lo > 0 and hi / lo < 10
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"))
    ax.yaxis.set_minor_locator(NullLocator())  # no minor ticks: fewer labels to lay out
    if lo is not None and hi is not None and lo > 0:  # room above and below the extreme markers
        pad = 1.15 if narrow else 1.3
        ax.set_ylim(lo / pad, hi * pad)
        ax.yaxis.set_major_locator(FixedLocator(log_ticks(lo / pad, hi * pad)))


_NUMBER_WORDS = (
    "no",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)


def counted(text: str, systems) -> str:
    """A title's "the six systems" as the number of systems drawn (a user's seventh included)."""
    n = len(list(systems))
    word = _NUMBER_WORDS[n] if n < len(_NUMBER_WORDS) else str(n)
    return text.replace("six systems", f"{word} system" + ("" if n == 1 else "s"))


def _fmt_x(v) -> str:
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


@dataclass(frozen=True)
class PerfFigure:
    name: str
    exp: str
    title: str
    kind: str  # "bars" | "sweep"
    facets: tuple[str, ...] = ("workload.name",)
    x: str | None = None
    x_label: str = ""
    x_log: int = 0  # log base of the x axis (0 = linear)
    x_percent: bool = False  # show x * 100 (memory fraction)
    notes: str = ""  # reconstruction choices and what the paper leaves open
    caption_extra: Callable[[pd.DataFrame], str] | None = field(default=None, compare=False)

    # -- data ---------------------------------------------------------------------------
    def cells(self, results_dir: str | Path) -> pd.DataFrame:
        df = require(load_cells(results_dir, self.exp), self.exp, [SYSTEM])
        return df

    def facet_columns(self, df: pd.DataFrame) -> list[str]:
        return [f for f in self.facets if f in df]

    def point_keys(self, df: pd.DataFrame) -> list[str]:
        keys = self.facet_columns(df) + [SYSTEM]
        if self.kind == "sweep":
            if self.x not in df:
                raise ValueError(f"{self.name}: no cell of results/{self.exp}/ has the swept field {self.x!r}")
            keys.append(self.x)
        return keys

    def table(self, results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(cells, aggregated points) — what the plot and the claims read."""
        df = self.cells(results_dir)
        keys = self.point_keys(df)
        if self.kind == "sweep":
            df = df.copy()
            df[self.x] = pd.to_numeric(df[self.x], errors="coerce")
        agg = aggregate(df, keys, self.exp, METRICS)
        order = {s: i for i, s in enumerate(system_order(agg[SYSTEM]))}
        facet_cols = self.facet_columns(df)

        def rank(i: int) -> tuple:
            r = agg.iloc[i]
            x = r[self.x] if self.kind == "sweep" else 0.0
            return (*(_facet_rank(c, r[c]) for c in facet_cols), order[r[SYSTEM]], np.inf if pd.isna(x) else x)

        agg = agg.iloc[sorted(range(len(agg)), key=rank)].reset_index(drop=True)
        return df, agg

    # -- text ---------------------------------------------------------------------------
    def caption(self, df: pd.DataFrame) -> str:
        keys = self.point_keys(df)
        systems = system_order(df[SYSTEM])
        parts = [f"{counted(self.title, systems)}.", captions.provenance_caption(df, keys)]
        if self.caption_extra is not None:
            extra = self.caption_extra(df)
            if extra:
                parts.append(extra)
        if self.notes:
            parts.append(self.notes)
        extra = [s for s in systems if s not in PAPER_SYSTEMS and s not in self.notes]
        if extra:
            parts.append(f"Beyond the paper's six systems: {', '.join(extra)}.")
        parts.append(
            f"All latency and TTFT panels share one scale: logarithmic when the values of any of them span "
            f"more than {LOG_SPAN:g}x, else linear"
            + (
                " from 0."
                if self.kind == "bars"
                else "; bands are ± SD over seeds where there are several; points of neighbouring systems are "
                "shifted slightly sideways so that equal values stay visible (ticks mark the true x)."
            )
        )
        if self.kind == "sweep":
            parts.append(REGIME_NOTE)
        return " ".join(parts)

    # -- drawing ------------------------------------------------------------------------
    def render(self, results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        df, agg = self.table(results_dir)
        apply_style()
        facet_cols = self.facet_columns(df)
        facets = [()] if not facet_cols else list(dict.fromkeys(map(tuple, agg[facet_cols].to_numpy().tolist())))
        systems = system_order(agg[SYSTEM])
        colors = system_colors(systems)
        n_rows, n_cols = len(facets), len(METRICS)
        log_time = log_time_panels(agg)
        fig, axes = plt.subplots(n_rows, n_cols, figsize=(2.25 * n_cols, 1.95 * n_rows + 0.4), squeeze=False)
        for r, fv in enumerate(facets):
            sel = np.ones(len(agg), dtype=bool)
            for c, v in zip(facet_cols, fv):
                sel &= (agg[c].map(str) == str(v)).to_numpy()
            part = agg[sel]
            row_label = " / ".join(_fmt_x(v) for v in fv)
            for c, metric in enumerate(METRICS):
                ax = axes[r][c]
                if self.kind == "bars":
                    self._bars(ax, part, metric, systems, colors)
                else:
                    self._sweep(ax, part, metric, systems, colors, log_y=metric in LOG_METRICS and log_time)
                ax.set_title(METRIC_LABELS[metric] if r == 0 else "")
                ax.set_ylabel(row_label if c == 0 and n_rows > 1 else "", fontweight="bold")
                if metric in LOG_METRICS and log_time:
                    vals = part[metric].to_numpy(dtype=float)
                    vals = vals[np.isfinite(vals) & (vals > 0)]
                    if self.kind == "bars":  # room under the shortest bar
                        log_axis(ax)
                        if len(vals):
                            ax.set_ylim(bottom=float(vals.min()) / 3)
                    elif len(vals):
                        sds = part[f"{metric}_sd"].to_numpy(dtype=float)
                        top = float(np.nanmax(part[metric].to_numpy(dtype=float) + np.nan_to_num(sds)))
                        log_axis(ax, float(vals.min()), max(top, float(vals.max())))
        reference = {s for s in systems if self.kind == "sweep" and agg.loc[agg[SYSTEM] == s, self.x].isna().all()}
        handles = [
            Patch(facecolor=colors[s], label=s)
            if self.kind == "bars"
            else Line2D(
                [0],
                [0],
                color=colors[s],
                label=s,
                **({"ls": ":", "lw": 1.2} if s in reference else line_style(s, systems)),
            )
            for s in systems
        ]
        if self.kind == "sweep":
            handles += regime_legend_handles(agg["regime"])
        title_and_legend(fig, counted(self.title, systems), handles, ncol=min(len(handles), 8))
        caption = self.caption(df)
        add_caption(fig, caption, width_chars=int(2.25 * n_cols * 17))
        paths = save_figure(fig, figures_dir, self.name)
        paths.append(write_text(figures_dir, f"{self.name}.csv", self.csv(agg)))
        paths.append(write_text(figures_dir, f"{self.name}.caption.txt", caption + "\n"))
        return paths

    def _bars(self, ax, part, metric, systems, colors) -> None:
        rows = part.set_index(SYSTEM).reindex(systems)  # one bar slot per system, NaN if absent
        means = metric_values(metric, rows[metric])
        sds = metric_values(metric, rows[f"{metric}_sd"])
        several = (rows["n_seeds"].fillna(1) > 1).to_numpy()
        ax.bar(
            np.arange(len(systems)),
            np.nan_to_num(means),
            width=0.8,
            color=[colors[s] for s in systems],
            yerr=np.where(several, np.nan_to_num(sds), 0.0) if several.any() else None,
            capsize=2,
            error_kw={"lw": 0.8},
        )
        ax.set_xticks(np.arange(len(systems)))
        ax.set_xticklabels([])
        ax.set_xlim(-0.6, len(systems) - 0.4)
        ax.grid(axis="x", visible=False)

    def _sweep(self, ax, part, metric, systems, colors, log_y: bool = False) -> None:
        from matplotlib.ticker import NullLocator

        scale = 100.0 if self.x_percent else 1.0
        xs_all = part[self.x].dropna()
        shifts = dodge_offsets(xs_all.to_numpy(dtype=float) * scale, len(systems), self.x_log)
        for s in systems:
            row = part[part[SYSTEM] == s]
            if row.empty:
                continue
            line = row.dropna(subset=[self.x]).sort_values(self.x)
            if line.empty:  # the system does not have this knob: horizontal reference
                mean = metric_values(metric, row[metric])[0]
                ax.axhline(mean, color=colors[s], ls=":", lw=1.2)
                continue
            x = line[self.x].to_numpy(dtype=float) * scale
            shift = shifts[systems.index(s)]
            x = x * shift if self.x_log else x + shift
            y = metric_values(metric, line[metric])
            sd = metric_values(metric, line[f"{metric}_sd"])
            ax.plot(x, y, color=colors[s], clip_on=False, zorder=3, **line_style(s, systems))
            mark_regimes(ax, x, y, line["regime"].tolist())
            if (line["n_seeds"] > 1).any():
                lo = np.maximum(y - sd, y * 1e-3) if log_y else y - sd
                ax.fill_between(x, lo, y + sd, color=colors[s], alpha=0.18, lw=0)
        if not log_y:
            # linear from 0 (hit rate, throughput: small differences stay small), headroom on top
            vals = metric_values(metric, part[metric] + part[f"{metric}_sd"].fillna(0))
            top = float(np.nanmax(vals)) if np.isfinite(vals).any() else 1.0
            ax.set_ylim(0, (top * HEADROOM) if top > 0 else 1.0)
        if self.x_log:
            ax.set_xscale("log", base=self.x_log)
        ticks = sorted(set((xs_all.to_numpy(dtype=float) * scale).tolist()))
        if 0 < len(ticks) <= 10:
            ax.set_xticks(ticks)
            ax.set_xticklabels([_fmt_x(t) for t in ticks], rotation=0)
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(self.x_label or knob_label(str(self.x)))

    def csv(self, agg: pd.DataFrame) -> str:
        cols = [c for c in agg.columns if c != "seeds"]
        out = agg[cols].copy()
        out["seeds"] = agg["seeds"].map(lambda t: " ".join(str(s) for s in t))
        return out.to_csv(index=False, float_format="%.6g", lineterminator="\n")


__all__ = ["PerfFigure", "metric_values"]
