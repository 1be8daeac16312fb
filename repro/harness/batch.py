"""Several experiments' grids as one sweep in this process: `python -m repro.figures --run-missing`.

Running `python -m repro.run +exp=NAME` once per experiment pays, per experiment, a process
start-up (imports, Hydra), a new worker pool (spawn + imports in every worker) and a tail
where one core idles while the other finishes the experiment's last cell. Here every
experiment's grid is planned exactly as `repro.run` plans it (same Hydra composition, same
overrides, same signatures, so the same cells and the same files), validated with one memo
(a workload shared by several experiments is built once for its `max_request_tokens`), and
all cells not finished go through one pool (repro.harness.sweep.run_fed_specs): the planning
runs in a thread while the workers already run the cells of the experiments planned before,
so the parent's validation (which tokenises each workload's data once, for the disk cache)
overlaps the simulation, and both cores stay busy until the last cell. An experiment whose
grid is invalid is reported (exit code 2) before any of its cells runs; the others still run. Each experiment then gets the summary table `repro.run`
prints. A cell's result never depends on which process or in which order it runs
(each cell is seeded from its own config), so the results are byte-identical.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from typing import Callable, Sequence, TextIO

from repro.harness.cell import CellOutcome, Stopped, use_workload_memo
from repro.harness.compose import GridComposer, compose_cells
from repro.harness.grid import Cell, expand_grid, split_sweep_overrides
from repro.harness.pool import Task
from repro.harness.sweep import (
    _raise_stopped,
    cell_states,
    check_writable,
    exit_code,
    format_table,
    make_specs,
    run_fed_specs,
    summary_table,
)
from repro.harness.validate import ConfigError, _Memo, cell_errors, format_errors


# A replayed path of a theory cell costs about this fraction of a simulated request (measured:
# ~3 us per path against ~40-80 us per request); only the order of the costs matters.
THEORY_PATH_COST = 1 / 20


def cell_cost(spec) -> float:
    """A guess of a cell's run time in simulated requests, to start the long cells first (the
    last ones then are short, so both cores finish together): a serving cell's request count (a
    whole trace, num_queries null, counts as the longest), a theory cell's replayed paths."""
    cfg = spec.config
    if (cfg.get("backend") or {}).get("name") == "theory":
        from repro.backends.theory import replayed_paths

        return replayed_paths(cfg) * THEORY_PATH_COST
    wl = cfg.get("workload")
    if not isinstance(wl, dict):
        return 0.0
    n = wl.get("num_queries")
    return float("inf") if n is None else float(n)


@dataclasses.dataclass
class Planned:
    exp: str
    cells: list[Cell]
    error: str | None = None  # ConfigError text: nothing of this experiment runs


def _plan(exp: str, overrides: Sequence[str], composer: GridComposer, memo: _Memo) -> Planned:
    from hydra import compose
    from omegaconf import OmegaConf

    ovs = [f"exp={exp}", *overrides]
    try:
        plain, _ = split_sweep_overrides(ovs)  # as repro.run: sweeps join the grid, not the run config
        with_hydra = compose(config_name="config", overrides=plain, return_hydra_config=True)
        sp = with_hydra.hydra.sweeper.get("params")
        params = OmegaConf.to_container(sp) if sp is not None else None
        cells = expand_grid(params, ovs)
        compose_cells(cells, composer)
    except ConfigError as exc:
        return Planned(exp, [], str(exc))
    except Exception as exc:  # Hydra's own composition errors, as repro.run reports them
        return Planned(exp, [], f"{type(exc).__name__}: {exc}")
    problems: dict[str, list[str]] = {}
    bad = 0
    for c in cells:
        errs = cell_errors(c.config, deep=True, memo=memo)
        bad += bool(errs)
        for msg in dict.fromkeys(errs):
            problems.setdefault(msg, []).append(f"{c.index} [{c.label}]")
    if problems:
        return Planned(exp, cells, format_errors(problems, len(cells), bad))
    return Planned(exp, cells)


def run_experiments(
    exps: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    n_jobs: int | None = None,
    config_dir: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    then: Callable[[str], Sequence[Task]] | None = None,
) -> dict[str, int]:
    """Plan every experiment, run all their unfinished cells in one pool; exit code per
    experiment as `python -m repro.run +exp=NAME OVERRIDES` would return it (2: invalid
    configuration, nothing of it ran; 1: a cell failed; 130 / 143: stopped). config_dir: a
    further config tree searched like `--config-dir` (tests). `then(exp)`: pool Tasks that
    follow an experiment (its figures), run on the same workers once its last cell is done."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import repro.harness.schema  # noqa: F401  (registers the structured schema before composition)
    from repro.confutil import CONF_DIR

    out, err = out or sys.stdout, err or sys.stderr
    memo = _Memo()
    codes: dict[str, int] = {}
    runnable: list[tuple[Planned, list]] = []
    n_next = [0]
    waiting: dict[str, set[int]] = {}  # experiment -> indices of its cells still running
    exp_of: dict[int, str] = {}

    def after(outcome: CellOutcome) -> Sequence[Task]:
        """then(exp) once the last of exp's cells that run here is done (none run: no tasks)."""
        exp = exp_of[outcome.index]
        waiting[exp].discard(outcome.index)
        return then(exp) if then is not None and not waiting[exp] else []

    t0 = time.perf_counter()
    if config_dir is not None:
        overrides = [f"hydra.searchpath=[file://{config_dir}]", *overrides]

    def plan(submit) -> None:
        use_workload_memo(True)  # validation builds each workload once (the pool's end turns it off)
        # one numbering over all experiments (the pool keys outcomes by index); labels stay
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composer = GridComposer("config")
            for exp in exps:
                p = _plan(exp, overrides, composer, memo)
                if p.error is not None:
                    print(f"repro.run +exp={p.exp}: {p.error}", file=err, flush=True)
                    codes[p.exp] = 2
                    continue
                specs = make_specs(p.cells)
                try:
                    check_writable(specs)
                except ConfigError as exc:
                    print(f"repro.run +exp={p.exp}: {exc}", file=err, flush=True)
                    codes[p.exp] = 2
                    continue
                specs = [dataclasses.replace(s, index=n_next[0] + i) for i, s in enumerate(specs)]
                n_next[0] += len(specs)
                runnable.append((p, specs))
                exp_of.update((s.index, p.exp) for s in specs)
                waiting[p.exp] = {s.index for s in submit(specs, cell_states(specs))}
        print(f"[plan] {len(exps)} experiment(s), {n_next[0]} cells planned after "
              f"{time.perf_counter() - t0:.1f} s", file=err, flush=True)

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        outcomes: list[CellOutcome] = run_fed_specs(plan, n_jobs=n_jobs, desc=f"{len(exps)} experiments",
                                                   cost=cell_cost, after=after)
    except (KeyboardInterrupt, Stopped) as exc:
        print(f"stopped ({'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else exc}); finished cells are kept, "
              f"the interrupted ones left no files; rerun to resume", file=err)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 143
        return {**{e: code for e in exps}, **{e: c for e, c in codes.items() if c == 2}}
    finally:
        signal.signal(signal.SIGTERM, previous)
    pos = 0
    for p, specs in runnable:
        mine = outcomes[pos:pos + len(specs)]
        pos += len(specs)
        local = [dataclasses.replace(o, index=c.index) for o, c in zip(mine, p.cells)]
        print(format_table(summary_table(p.cells, local)), file=out)
        counts = {s: sum(o.status == s for o in local) for s in ("ran", "skipped", "failed")}
        root = f"{specs[0].results_dir}/{p.exp}" if specs else "."
        print(f"{p.exp}: {counts['ran']} ran, {counts['skipped']} skipped (finished), {counts['failed']} failed "
              f"-> {root}", file=out)
        for o in local:
            if o.status == "failed" and not o.extra.get("same_as_cell"):
                print(f"  cell {o.index} FAILED: {o.error}  (traceback: {o.extra.get('error_file', '?')})", file=out)
        codes[p.exp] = exit_code(local)
    return codes
