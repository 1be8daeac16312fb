"""The in-process grid: plan (expand + compose + validate every cell), run on local cores, report.

`python -m repro.run +exp=NAME` ends up in `run_sweep`. Cells run in a process pool of
`n_jobs` workers (spawn start method: no fork of a process that may hold threads, e.g.
tqdm's monitor or a W&B service), one cell per task; with n_jobs == 1 (or a single cell)
they run in this process. Each cell is self-contained and seeded from its own config, so
n_jobs never changes a result. Finished cells are skipped before any worker starts, and
two cells with the same signature run once.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repro.harness.cell import CellOutcome, CellSpec, run_cell_spec
from repro.harness.compose import compose_cells
from repro.harness.grid import Cell, expand_grid
from repro.harness.validate import validate_configs
from repro.results import CellStore

TABLE_METRICS = (
    "hit_rate",
    "latency_p50_s",
    "latency_p95_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "throughput_rps",
    "num_failed",
)
THEORY_METRICS = ("misses_per_phase", "ci95_low", "ci95_high", "lru_bound", "harmonic", "opt_bound")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def plan_cells(
    params: Mapping[str, Any] | None,
    overrides: Sequence[str],
    compose_fn: Callable[[Sequence[str]], Any],
    *,
    deep: bool = True,
) -> list[Cell]:
    """Expand the grid, compose and sign every cell, validate them all (ConfigError if any is bad)."""
    cells = expand_grid(params, overrides)
    compose_cells(cells, compose_fn)
    validate_configs(((f"{c.index} [{c.label}]", c.config) for c in cells), deep=deep)
    return cells


def absolute_results_dir(results_dir: str) -> str:
    """Relative results_dir is relative to where the user launched (Hydra's runtime.cwd if set)."""
    path = Path(results_dir).expanduser()
    if not path.is_absolute():
        try:
            from hydra.core.hydra_config import HydraConfig

            base = Path(HydraConfig.get().runtime.cwd)
        except Exception:
            base = Path.cwd()
        path = base / path
    return str(path)


def make_specs(cells: Sequence[Cell]) -> list[CellSpec]:
    return [
        CellSpec(
            index=c.index,
            label=c.label,
            config=c.config,
            signature=c.signature,
            results_dir=absolute_results_dir(str(c.config["results_dir"])),
            exp_name=str(c.config["exp_name"]),
        )
        for c in cells
    ]


def _bar(total: int, desc: str):
    from repro.harness.progress import SweepProgress  # tqdm on a terminal, plain lines elsewhere

    return SweepProgress(total, desc)


def run_specs(specs: Sequence[CellSpec], n_jobs: int | None = None, desc: str = "cells") -> list[CellOutcome]:
    """Run every cell not yet finished; outcomes in the order of `specs`."""
    outcomes: dict[int, CellOutcome] = {}
    first_of: dict[tuple[str, str, str], int] = {}
    todo: list[CellSpec] = []
    for spec in specs:
        key = (spec.results_dir, spec.exp_name, spec.signature)
        store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
        if key in first_of:
            continue  # same signature as an earlier cell: filled in below
        first_of[key] = spec.index
        if store.is_finished():
            outcomes[spec.index] = CellOutcome(
                spec.index, spec.signature, "skipped", str(store.dir), summary=store.read_summary()
            )
        else:
            todo.append(spec)

    n_jobs = usable_cpus() if n_jobs is None else int(n_jobs)
    n_jobs = max(1, min(n_jobs, len(todo)))
    bar = _bar(len(todo), desc)
    try:
        if n_jobs == 1:
            for spec in todo:
                out = run_cell_spec(spec)
                outcomes[spec.index] = out
                bar.update(failed=out.status == "failed")
        elif todo:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
                futures = {pool.submit(run_cell_spec, spec): spec for spec in todo}
                for fut in as_completed(futures):
                    spec = futures[fut]
                    try:
                        out = fut.result()
                    except BrokenProcessPool as exc:
                        out = CellOutcome(
                            spec.index,
                            spec.signature,
                            "failed",
                            str(CellStore(spec.results_dir, spec.exp_name, spec.signature).dir),
                            error=f"worker process died before finishing this cell ({exc}); rerun to resume",
                        )
                    except Exception as exc:  # pickling or other pool-level errors
                        out = CellOutcome(
                            spec.index, spec.signature, "failed", "", error=f"{type(exc).__name__}: {exc}"
                        )
                    outcomes[spec.index] = out
                    bar.update(failed=out.status == "failed")
    finally:
        bar.close()

    for spec in specs:  # duplicates share the first cell's outcome
        if spec.index not in outcomes:
            first = outcomes[first_of[(spec.results_dir, spec.exp_name, spec.signature)]]
            outcomes[spec.index] = CellOutcome(
                spec.index,
                spec.signature,
                first.status if first.status == "failed" else "skipped",
                first.dir,
                summary=first.summary,
                error=first.error,
                extra={"same_as_cell": first.index},
            )
    return [outcomes[s.index] for s in specs]


def summary_table(cells: Sequence[Cell], outcomes: Sequence[CellOutcome]):
    """One row per cell: the swept keys, status, signature and the headline metrics."""
    import pandas as pd

    swept_keys: list[str] = []
    for c in cells:
        for k in c.swept:
            if k not in swept_keys:
                swept_keys.append(k)
    rows = []
    for c, o in zip(cells, outcomes):
        row: dict[str, Any] = {"cell": c.index}
        for k in swept_keys:
            row[k] = c.swept.get(k)
        row["status"] = o.status
        row["sig"] = o.signature
        summ = o.summary or {}
        keys = [k for k in TABLE_METRICS if k in summ] or [k for k in THEORY_METRICS if k in summ] or [
            k for k, v in summ.items() if k != "provenance" and isinstance(v, (int, float))
        ]
        for k in keys:
            row[k] = summ[k]
        rows.append(row)
    return pd.DataFrame(rows)


def format_table(df) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    return df.to_string(index=False, formatters={c: fmt for c in df.columns}) if len(df) else "(no cells)"


def exit_code(outcomes: Sequence[CellOutcome]) -> int:
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def run_sweep(
    params: Mapping[str, Any] | None,
    overrides: Sequence[str],
    compose_fn: Callable[[Sequence[str]], Any],
    *,
    n_jobs: int | None = None,
    dry_run: bool = False,
    out=None,
) -> int:
    """Plan, validate, run and report a whole grid; returns the process exit code."""
    out = out or sys.stdout
    cells = plan_cells(params, overrides, compose_fn)
    specs = make_specs(cells)
    exp = specs[0].exp_name if specs else "?"
    if dry_run:
        done = [CellStore(s.results_dir, s.exp_name, s.signature).is_finished() for s in specs]
        for s, d in zip(specs, done):
            print(f"{s.index:4d}  {s.signature}  {'finished' if d else 'missing '}  {s.label}", file=out)
        print(f"{exp}: {len(specs)} cell(s), {sum(done)} finished, {len(specs) - sum(done)} to run", file=out)
        return 0
    if n_jobs is None:
        n_jobs = cells[0].config.get("n_jobs") if cells else None
    outcomes = run_specs(specs, n_jobs=n_jobs, desc=exp)
    print(format_table(summary_table(cells, outcomes)), file=out)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ran", "skipped", "failed")}
    root = Path(specs[0].results_dir) / exp if specs else Path(".")
    print(f"{exp}: {counts['ran']} ran, {counts['skipped']} skipped (finished), {counts['failed']} failed -> {root}", file=out)
    for o in outcomes:
        if o.status == "failed" and not o.extra.get("same_as_cell"):
            print(f"  cell {o.index} FAILED: {o.error}  (traceback: {Path(o.dir) / 'error.txt'})", file=out)
    return exit_code(outcomes)
