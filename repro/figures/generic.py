"""The performance figure of any experiment folder, the user's own included (`python -m
repro.figures my_fig2 --results-dir R --figures-dir F`): the plot kind is picked from the cells.

Rows: one per model and per workload when the cells hold several. The x axis: the one config
field, besides the seed and the system's own router/eviction settings, that still varies within
a row and a system: none -> the bar grid (one bar per system, like Fig. 2), one -> the sweep
strip (one line per system, like Fig. 5), several -> a ResultsError naming them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.figures.knobs import knob_label, knob_name_unit
from repro.figures.load import SEED, SYSTEM, ResultsError, _config_columns, _key, load_cells, require
from repro.figures.perf import PerfFigure

FACETS = ("model.name", "workload.name")
_OF_THE_SYSTEM = ("router.", "eviction.", "policy")  # fields that change with the system


def figure_for(exp: str, results_dir: str | Path) -> PerfFigure:
    df = require(load_cells(results_dir, exp), exp, [SYSTEM])
    facets = tuple(f for f in FACETS if f in df and df[f].map(_key).nunique() > 1) or ("workload.name",)
    groups = [df[c].map(_key) for c in (*(f for f in facets if f in df), SYSTEM)]
    candidates = []
    for c in _config_columns(df):
        if c in facets or c == SEED or c.startswith(_OF_THE_SYSTEM):
            continue
        if not pd.api.types.is_numeric_dtype(df[c]) or df[c].map(_key).nunique() < 2:
            continue
        if (df[c].map(_key).groupby(groups, sort=False).nunique() > 1).any():
            candidates.append(c)
    if len(candidates) > 1:
        raise ResultsError(f"results/{exp}/: cannot pick one x axis, several fields vary within a system: {candidates}")
    x = candidates[0] if candidates else None
    what = f"performance of the six systems vs {knob_name_unit(x)[0]}" if x else "performance of the six systems"
    return PerfFigure(
        name=exp,
        exp=exp,
        title=f"{what[0].upper()}{what[1:]} (results/{exp}/)",  # "six systems": counted
        kind="sweep" if x else "bars",
        facets=facets,
        x=x,
        x_label=knob_label(x) if x else "",
        x_log=_log_base(df[x]) if x else 0,
    )


def _log_base(values: pd.Series) -> int:
    """2 for a sweep of powers of two spanning more than 8x (batch sizes, output lengths), else linear."""
    import numpy as np

    v = pd.to_numeric(values, errors="coerce").dropna().unique()
    if len(v) < 2 or (v <= 0).any() or v.max() / v.min() <= 8:
        return 0
    return 2 if np.allclose(np.log2(v), np.round(np.log2(v))) else 0


def render(exp: str, results_dir: str | Path, figures_dir: str | Path) -> list[Path]:
    return figure_for(exp, results_dir).render(results_dir, figures_dir)


__all__ = ["figure_for", "render"]
