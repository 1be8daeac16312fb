"""Competitive-ratio experiments (paper App. C): lower-bound constructions, random traces, per-cell runner.

`run_theory_cell(params) -> dict` runs one cell (see repro.theory.experiment);
`python -m repro.theory.competitive_ratio` runs the grid (`python -m repro.figures` renders it).
"""

from repro.theory.constructions import lower_bound_paths, random_prefix_tree_trace, theorem4_trace, theorem5_trace
from repro.theory.experiment import build_cell_trace, harmonic, run_theory_cell

__all__ = [
    "build_cell_trace",
    "harmonic",
    "lower_bound_paths",
    "random_prefix_tree_trace",
    "run_theory_cell",
    "theorem4_trace",
    "theorem5_trace",
]
