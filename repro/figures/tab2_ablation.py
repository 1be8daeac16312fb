"""Table 2: ablation on GSP — Cache-Aware+LRU vs our three methods, with runtime overheads.

Columns: P50/P95 latency and TTFT (ms), hit rate (%), throughput (req/s), and the measured
wall-clock overheads per query (ms): eviction CPU time / requests, and routing decisions +
completion callbacks (where LBGR updates its model) / requests. Overheads are measured on the
machine that ran the cells (Python simulator here, not SGLang's C++/Rust): compare them
between rows, not with the paper's absolute milliseconds. Rows are whatever systems the
experiment ran, in the paper's order; mean ± SD over seeds.
"""

from __future__ import annotations

from pathlib import Path

from repro.figures import captions
from repro.figures.load import DERIVED, METRICS, SYSTEM, aggregate, load_cells, require
from repro.figures.style import system_order, write_table, write_text
from repro.figures.tables import OVERHEAD_COLUMNS, PERF_COLUMNS, display

NAME = EXP = "tab2_ablation"
TITLE = "Table 2: ablation of RLT and LBGR on GSP, with eviction and routing overhead"


def table(results_dir: str | Path):
    df = require(load_cells(results_dir, EXP), EXP, [SYSTEM])
    keys = [k for k in ("workload.name",) if k in df] + [SYSTEM]
    agg = aggregate(df, keys, EXP, METRICS + DERIVED[:2])
    order = {s: i for i, s in enumerate(system_order(agg[SYSTEM]))}
    agg = agg.iloc[sorted(range(len(agg)), key=lambda i: (str(agg[keys[0]].iloc[i]), order[agg[SYSTEM].iloc[i]]))]
    return df, agg.reset_index(drop=True), keys


def render(results_dir: str | Path = "results", figures_dir: str | Path = "figures") -> list[Path]:
    df, agg, keys = table(results_dir)
    labels = (
        {"System": SYSTEM}
        if keys == [SYSTEM] or agg[keys[0]].nunique() == 1
        else {"Workload": keys[0], "System": SYSTEM}
    )
    shown = display(agg, labels, PERF_COLUMNS + OVERHEAD_COLUMNS)
    caption = (
        f"{TITLE}. {captions.provenance_caption(df, keys)} Time metrics in ms (lower is better), hit rate in %, "
        "throughput in req/s. Overheads are wall-clock CPU time per query measured while the cells ran "
        "(eviction calls; routing decisions + completion callbacks) on the machine that ran them."
    )
    paths = write_table(shown, figures_dir, NAME, caption)
    paths.append(write_text(figures_dir, f"{NAME}.caption.txt", caption + "\n"))
    return paths
