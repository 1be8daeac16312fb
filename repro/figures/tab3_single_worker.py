"""Table 3 (appendix): RLT vs L-LRU eviction on a single worker.

Appendix B did not survive the paper's text extraction; the table's shape is our
reconstruction: one row per (workload, eviction policy) with the same metrics as Table 2.
With one worker the router has no choice, so rows are labelled by the eviction policy.
"""

from __future__ import annotations

from pathlib import Path

from repro.figures import captions
from repro.figures.load import DERIVED, METRICS, aggregate, load_cells, require
from repro.figures.style import write_table, write_text
from repro.figures.tables import OVERHEAD_COLUMNS, PERF_COLUMNS, display

NAME = EXP = "tab3_single_worker"
TITLE = "Table 3: RLT vs L-LRU eviction on a single worker"
EVICTION = "eviction.name"
LABELS = {"lru": "L-LRU", "rlt": "RLT", "opt": "OPT"}


def table(results_dir: str | Path):
    df = require(load_cells(results_dir, EXP), EXP, [EVICTION])
    keys = [k for k in ("workload.name",) if k in df] + [EVICTION]
    agg = aggregate(df, keys, EXP, METRICS + DERIVED[:1])
    rank = {"lru": 0, "rlt": 1, "opt": 2}
    agg = agg.iloc[
        sorted(range(len(agg)), key=lambda i: tuple((rank.get(agg[k].iloc[i], 9), str(agg[k].iloc[i])) for k in keys))
    ]
    agg = agg.reset_index(drop=True)
    agg["eviction"] = agg[EVICTION].map(lambda e: LABELS.get(e, str(e)))
    return df, agg, keys


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    df, agg, keys = table(results_dir)
    labels = ({"Workload": keys[0]} if len(keys) > 1 else {}) | {"Eviction": "eviction"}
    shown = display(agg, labels, PERF_COLUMNS + OVERHEAD_COLUMNS[:1])
    workers = sorted(set(df["cluster.num_workers"])) if "cluster.num_workers" in df else []
    caption = (
        f"{TITLE}. {captions.provenance_caption(df, keys)} Workers per cell: {', '.join(map(str, workers)) or 'n/a'}. "
        "Reconstructed table (Appendix B is missing from the paper text): rows = workload x eviction policy, "
        "metrics as in Table 2."
    )
    paths = write_table(shown, figures_dir, NAME, caption)
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths
