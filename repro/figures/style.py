"""Plot style, system colours and deterministic writers for every figure and table.

Determinism: Agg backend, matplotlib's bundled DejaVu fonts at fixed sizes, no `Software`
text chunk in PNGs, no Creator/Producer/CreationDate in PDFs (matplotlib would otherwise
stamp the time or honour SOURCE_DATE_EPOCH). The same results give byte-identical files on
one machine with the same library versions. All writes are atomic (repro.results).
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from repro.fileio import write_atomic  # noqa: E402
from repro.metrics.summary import BACKLOG_UTIL, BACKLOG_WAIT_SHARE, OVERLOAD_GROWTH_SHARE  # noqa: E402

PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}

# The paper's six systems (their policy_name in results/) in the paper's order, three baselines
# then ours, each with a fixed colour (seaborn "colorblind") so a system looks the same in every
# figure. The one list of them in repro/figures: the order and the baseline / ours split follow.
SYSTEM_COLORS = {
    "Random+LRU": "#949494",  # grey
    "RoundRobin+LRU": "#ca9161",  # brown
    "CacheAware+LRU": "#d55e00",  # vermillion (the state of the art)
    "CacheAware+RLT": "#cc78bc",  # pink
    "LBGR+LRU": "#029e73",  # green
    "LBGR+RLT": "#0173b2",  # blue
}
PAPER_SYSTEMS = tuple(SYSTEM_COLORS)
BASELINES, OURS = PAPER_SYSTEMS[:3], PAPER_SYSTEMS[3:]
# Colours of systems beyond the paper's six (Dynamo, llm-d, ...), in system_order.
_EXTRA = ("#de8f05", "#fbafe4", "#56b4e9", "#ece133", "#000000", "#6a3d9a", "#17becf", "#8c8c00", "#b15928", "#1f3a93")

METRIC_LABELS = {
    "latency_p50_s": "P50 latency (s)",
    "latency_p95_s": "P95 latency (s)",
    "ttft_p50_s": "P50 TTFT (s)",
    "ttft_p95_s": "P95 TTFT (s)",
    "hit_rate": "Cache hit rate (%)",
    "throughput_rps": "Throughput (req/s)",
}
# Time metrics span orders of magnitude between systems (the paper reports 10-40x): log axes.
LOG_METRICS = ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s")


# How a point of a load sweep shows its load regime (summary.json `regime`, ALGORITHMS.md §5), drawn
# over the system's own marker: a dark ring = backlogged, a dark × = overloaded; stable: nothing.
REGIME_MARKS = {
    "backlogged": {"marker": "o", "ms": 8.5, "mfc": "none", "mec": "0.15", "mew": 0.8},
    "overloaded": {"marker": "x", "ms": 7.0, "mec": "0.0", "mew": 1.3},
}


def mark_regimes(ax, x, y, regimes) -> None:
    """Overlay REGIME_MARKS on the points (x, y) whose regime is not stable (with a white halo, so
    that a mark stays visible on a dark heatmap cell)."""
    from matplotlib.patheffects import Normal, Stroke

    halo = [Stroke(linewidth=2.6, foreground="white"), Normal()]
    for kind, mark in REGIME_MARKS.items():
        sel = [i for i, r in enumerate(regimes) if r == kind]
        if sel:
            ax.plot(
                [x[i] for i in sel], [y[i] for i in sel], ls="none", zorder=4, clip_on=False, path_effects=halo, **mark
            )


def regime_legend_handles(regimes) -> list:
    """Legend entries for the marks that `regimes` use (none when every point is stable)."""
    from matplotlib.lines import Line2D

    present = set(regimes)
    return [Line2D([0], [0], ls="none", label=kind, **mark) for kind, mark in REGIME_MARKS.items() if kind in present]


REGIME_NOTE = (
    "A dark ring marks a backlogged point, a dark × an overloaded one (its worst seed; summary.json `regime`: "
    f"overloaded = the backlog grows by >= {OVERLOAD_GROWTH_SHARE:.0%} of the arrival rate, backlogged = median "
    f"queue wait >= {BACKLOG_WAIT_SHARE:.0%} of the latency or a worker busy >= {BACKLOG_UTIL:.0%} of the "
    "time; docs/ALGORITHMS.md §5)."
)


def apply_style() -> None:
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font="DejaVu Sans")
    plt.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "font.size": 8,
            "axes.titlesize": 8,
            "axes.labelsize": 8,
            "xtick.labelsize": 7,
            "ytick.labelsize": 7,
            "legend.fontsize": 7,
            "svg.hashsalt": "repro",
            "pdf.compression": 6,
        }
    )


def system_order(systems) -> list[str]:
    """The paper's six first (paper order), any other system after them, sorted by name."""
    present = list(dict.fromkeys(systems))
    first = [s for s in PAPER_SYSTEMS if s in present]
    return first + sorted(s for s in present if s not in PAPER_SYSTEMS)


def system_colors(systems) -> dict[str, str]:
    colors = dict(SYSTEM_COLORS)
    extras = [s for s in system_order(systems) if s not in colors]
    for i, s in enumerate(extras):
        colors[s] = _EXTRA[i % len(_EXTRA)]
    return {s: colors[s] for s in system_order(systems)}


def title_and_legend(fig, title: str, handles: list, ncol: int, head_in: float = 0.62, legend_in: float = 0.26) -> None:
    """Lay the panels out under a fixed band of `head_in` inches for the title and a legend whose
    top sits `legend_in` inches below the figure's top edge (inches, so any figure height fits)."""
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, 1 - head_in / height))
    fig.suptitle(title, y=1 - 0.08 / height, fontsize=9)
    fig.legend(
        handles=handles, loc="upper center", ncol=ncol, frameon=False, bbox_to_anchor=(0.5, 1 - legend_in / height)
    )


def add_caption(fig, caption: str, width_chars: int) -> None:
    """Caption under the axes (bbox_inches='tight' grows the canvas to hold it)."""
    wrapped = "\n".join(textwrap.fill(p, width_chars) for p in caption.split("\n"))
    fig.text(0.0, -0.01, wrapped, ha="left", va="top", fontsize=7, wrap=False)


def save_figure(fig, figures_dir: str | Path, name: str) -> list[Path]:
    """figures_dir/name.png and .pdf, atomically; closes the figure; returns the paths (inside
    repro.figures.protocols.protocol_files: name.<protocol>.png, ...)."""
    from repro.figures.protocols import suffixed

    out = []
    # The tight box is computed once and reused by both formats, instead of each
    # savefig(bbox_inches="tight") drawing the figure twice.
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    for ext, meta in (("png", PNG_METADATA), ("pdf", PDF_METADATA)):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, metadata=meta, bbox_inches=bbox)
        out.append(write_atomic(Path(figures_dir) / suffixed(f"{name}.{ext}"), buf.getvalue()))
    plt.close(fig)
    return out


def write_text(figures_dir: str | Path, filename: str, text: str) -> Path:
    """figures_dir/filename (inside repro.figures.protocols.protocol_files: with its suffix)."""
    from repro.figures.protocols import suffixed

    return write_atomic(Path(figures_dir) / suffixed(filename), text)


def latex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("$", r"\$"),
        ("#", r"\#"),
        ("_", r"\_"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("~", r"\textasciitilde{}"),
        ("^", r"\^{}"),
    ):
        text = text.replace(a, b)
    return text.replace("±", r"$\pm$").replace("×", r"$\times$").replace("−", "-").replace("Δ", r"$\Delta$")


def write_table(df, figures_dir: str | Path, name: str, caption: str) -> list[Path]:
    """figures_dir/name.md (caption + GitHub table) and name.tex (booktabs table, caption).

    `df` holds display strings already (formatting is the caller's choice); its index is
    dropped. Markdown goes through tabulate (pandas.to_markdown), LaTeX through pandas' Styler.
    """
    md = f"{caption}\n\n{df.to_markdown(index=False, disable_numparse=True)}\n"
    esc = df.copy()
    esc.columns = [latex_escape(str(c)) for c in esc.columns]
    esc = esc.map(lambda v: latex_escape(str(v)))
    tex = esc.style.hide(axis="index").to_latex(
        caption=latex_escape(caption),
        label=f"tab:{name}",
        hrules=True,
        position="t",
        column_format="l" + "r" * (len(esc.columns) - 1),
    )
    return [write_text(figures_dir, f"{name}.md", md), write_text(figures_dir, f"{name}.tex", tex)]
