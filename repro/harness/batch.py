"""Several experiments' grids as one sweep in this process: `python -m repro.figures --run-missing`.

Running `python -m repro.run +exp=NAME` once per experiment pays, per experiment, a process
start-up (imports, Hydra), a new worker pool (spawn + imports in every worker) and a tail
where one core idles while the other finishes the experiment's last cell. Here every
experiment's grid is planned exactly as `repro.run` plans it (same Hydra composition, same
overrides, same signatures, so the same cells and the same files), validated with one memo
(a workload shared by several experiments is built once for its `max_request_tokens`), and
all cells not finished go through one pool (repro.harness.sweep.run_fed_specs): the planning
runs in a thread while the workers already run the cells of the experiments planned before.
The workloads validation needs (their longest request) are built as pool Tasks on the workers,
all of an experiment's at once: the data sets are tokenised on both cores, once (the disk
cache), and each workload stays in the memo of the worker that built it, for its cells. Cells
are handed out longest first, so both cores stay busy until the last cell. An experiment whose
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
from repro.harness.validate import (
    NON_SERVING_BACKENDS,
    ConfigError,
    _Memo,
    deep_errors,
    format_errors,
    schema_errors,
    value_errors,
    workload_seed,
)


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


def longest_request(workload_cfg: dict, seed: int) -> int:
    """A pool Task: build the workload a cell with this run seed serves (left in the worker's
    workload memo and the disk cache for the cells that follow); its longest request."""
    from repro.backends import assembly

    return int(assembly.build_workload({"workload": workload_cfg}, assembly.SeedPlan.spawn(seed, 1)).max_request_tokens)


def _prebuild_workloads(
    cfgs: Sequence[dict], memo: _Memo, put_tasks: Callable[[Sequence[Task]], None], prebuilt: set[str]
) -> None:
    """Build the workloads the deep checks need on the pool's workers, all at once, and put their
    longest requests into the validation memo: the data sets are tokenised on both cores (not in
    this thread while the workers wait), and a workload is built where its cells run, not once
    here and again there. A build that fails is left to the check itself (its error message)."""
    import json
    import threading

    todo: dict[str, tuple[dict, int]] = {}
    for cfg in cfgs:
        wl = cfg.get("workload")
        if (cfg.get("backend") or {}).get("name") in NON_SERVING_BACKENDS or not isinstance(wl, dict):
            continue
        todo.setdefault(json.dumps([wl, cfg.get("seed")], sort_keys=True, default=str), (wl, cfg["seed"]))
    todo = {k: v for k, v in todo.items() if k not in prebuilt}
    if not todo:
        return
    left, lock, all_done = [len(todo)], threading.Lock(), threading.Event()

    def done_with(wl: dict, seed: int):
        def done(value, error) -> None:
            if error is None:  # the key check_cell (repro.backends.assembly) looks it up by
                memo.get("workload", [wl, workload_seed(seed)], lambda: value)
            with lock:
                left[0] -= 1
                if not left[0]:
                    all_done.set()

        return done

    put_tasks([Task(longest_request, (wl, seed), done_with(wl, seed)) for wl, seed in todo.values()])
    all_done.wait()
    prebuilt.update(todo)


def _plan_order(exps: Sequence[str], composer: GridComposer) -> list[str]:
    """The experiments on a non-serving backend (theory) first, the others in their order: one
    composition plans all of a theory grid, and its cells are the longest of the paper (a thm5
    RLT cell replays ~3M paths), so the workers start on them while the serving grids are still
    being composed. Read from each experiment's own defaults list (`override /backend: theory`);
    an experiment whose file cannot be read keeps its place. Only the order of work changes."""
    repo = composer._repo(())

    def first(exp: str) -> bool:
        try:
            found = repo.load_config(f"exp/{exp}")
            return found is not None and any(
                str(getattr(d, "group", "")).lstrip("/") == "backend"
                and getattr(d, "value", None) in NON_SERVING_BACKENDS
                for d in found.defaults_list or ()
            )
        except Exception:  # unknown internals or an unreadable file: no reordering
            return False

    return sorted(exps, key=lambda e: not first(e))  # stable


def _plan(
    exp: str,
    overrides: Sequence[str],
    composer: GridComposer,
    memo: _Memo,
    prebuild: Callable[[Sequence[dict]], None] | None = None,
) -> Planned:
    from hydra import compose
    from omegaconf import OmegaConf

    ovs = [f"exp={exp}", *overrides]
    try:
        plain, _ = split_sweep_overrides(ovs)  # as repro.run: sweeps join the grid, not the run config
        with_hydra = compose(config_name="config", overrides=plain, return_hydra_config=True)
        sp = with_hydra.hydra.sweeper.get("params")
        params = OmegaConf.to_container(sp, resolve=True) if sp is not None else None
        cells = expand_grid(params, ovs)
        compose_cells(cells, composer)
    except ConfigError as exc:
        return Planned(exp, [], str(exc))
    except Exception as exc:  # Hydra's own composition errors, as repro.run reports them
        return Planned(exp, [], f"{type(exc).__name__}: {exc}")
    problems: dict[str, list[str]] = {}
    bad = 0
    cheap = [schema_errors(c.config) + value_errors(c.config) for c in cells]  # cell_errors, in two steps
    if prebuild is not None:
        prebuild([c.config for c, e in zip(cells, cheap) if not e])
    for c, errs in zip(cells, cheap):
        errs = errs or deep_errors(c.config, memo)
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

    def plan(submit, put_tasks) -> None:
        use_workload_memo(True)  # validation builds each workload once (the pool's end turns it off)
        prebuilt: set[str] = set()

        def prebuild(cfgs: Sequence[dict]) -> None:
            _prebuild_workloads(cfgs, memo, put_tasks, prebuilt)

        # one numbering over all experiments (the pool keys outcomes by index); labels stay
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composer = GridComposer("config")
            for exp in _plan_order(exps, composer):
                p = _plan(exp, overrides, composer, memo, prebuild)
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
        print(
            f"[plan] {len(exps)} experiment(s), {n_next[0]} cells planned after {time.perf_counter() - t0:.1f} s",
            file=err,
            flush=True,
        )

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        outcomes: list[CellOutcome] = run_fed_specs(
            plan, n_jobs=n_jobs, desc=f"{len(exps)} experiments", cost=cell_cost, after=after
        )
    except (KeyboardInterrupt, Stopped) as exc:
        print(
            f"stopped ({'Ctrl-C' if isinstance(exc, KeyboardInterrupt) else exc}); finished cells are kept, "
            f"the interrupted ones left no files; rerun to resume",
            file=err,
        )
        code = 130 if isinstance(exc, KeyboardInterrupt) else 143
        return {**{e: code for e in exps}, **{e: c for e, c in codes.items() if c == 2}}
    finally:
        signal.signal(signal.SIGTERM, previous)
    pos = 0
    mine_of = {}
    for p, specs in runnable:  # outcomes come in planning order; the tables go in the order asked
        mine_of[p.exp] = outcomes[pos : pos + len(specs)]
        pos += len(specs)
    asked = {e: i for i, e in enumerate(exps)}
    for p, specs in sorted(runnable, key=lambda ps: asked[ps[0].exp]):
        mine = mine_of[p.exp]
        local = [dataclasses.replace(o, index=c.index) for o, c in zip(mine, p.cells)]
        print(format_table(summary_table(p.cells, local)), file=out)
        counts = {s: sum(o.status == s for o in local) for s in ("ran", "copied", "skipped", "failed")}
        root = f"{specs[0].results_dir}/{p.exp}" if specs else "."
        print(
            f"{p.exp}: {counts['ran']} ran, {counts['copied']} copied (from a finished twin), {counts['skipped']} "
            f"skipped (finished), {counts['failed']} failed -> {root}",
            file=out,
        )
        for o in local:
            if o.status == "failed" and not o.extra.get("same_as_cell"):
                print(f"  cell {o.index} FAILED: {o.error}  (traceback: {o.extra.get('error_file', '?')})", file=out)
        codes[p.exp] = exit_code(local)
    return codes
