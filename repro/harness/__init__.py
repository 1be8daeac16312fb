"""The harness: grid expansion, validation, the per-cell runner and the in-process sweep.

Entry point: `python -m repro.run +exp=NAME [overrides] [-m] [--dry-run]` (repro/run.py).

    expand_grid(params, overrides) -> list[Cell]           # Hydra's parser + basic sweeper order
    plan_cells(params, overrides, compose_fn) -> list[Cell] # + compose, sign, validate (ConfigError)
    run_specs(specs, n_jobs) -> list[CellOutcome]           # worker pool (harness.pool), skips fresh cells
    run_cell_spec(spec) -> CellOutcome                      # one cell into results/<exp>/<sig>/
    batch.run_experiments(exps, overrides) -> {exp: code}   # several grids, one pool (make figures)
"""

from repro.harness import schema as _schema  # noqa: F401  (registers the ConfigStore schema)
from repro.harness.cell import CellOutcome, CellSpec, run_cell_spec
from repro.harness.grid import Cell, expand_grid
from repro.harness.validate import ConfigError

__all__ = ["Cell", "CellOutcome", "CellSpec", "ConfigError", "expand_grid", "run_cell_spec"]
