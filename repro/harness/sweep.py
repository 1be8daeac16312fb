"""The in-process grid: plan (expand + compose + validate every cell), run on local cores, report.

`python -m repro.run +exp=NAME` ends up in `run_sweep`. Cells run on `n_jobs` worker
processes (repro.harness.pool: spawn, one cell at a time, stoppable); with n_jobs == 1 (or a
single cell) they run in this process. Each cell is self-contained and seeded from its own
config, so n_jobs never changes a result. Fresh finished cells are skipped before any worker
starts (stale ones rerun unless keep_stale=true), two cells with the same signature run once,
and cells another sweep is computing are waited for (their lock), never duplicated.
"""

from __future__ import annotations

import contextlib

import math
import os
import sys
import signal
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repro.harness.cell import CellOutcome, CellSpec, Stopped, clear_stop, raise_interrupt, raise_stopped
from repro.harness.compose import compose_cells
from repro.harness.grid import Cell, expand_grid
from repro.harness.validate import ConfigError, pools_unbuilt, validate_configs
from repro.results import CellStore

TABLE_METRICS = (
    "hit_rate",
    "latency_p50_s",
    "latency_p95_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "throughput_rps",
    "num_failed",
    "regime",  # where the numbers come from (ALGORITHMS.md §5)
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
    """A relative results_dir is relative to the project (the checkout holding conf/), not the cwd:
    `results` means the repository's results/ from any directory."""
    from repro.harness.freshness import PROJECT_ROOT

    path = Path(results_dir).expanduser()
    if not path.is_absolute():
        base = PROJECT_ROOT if (PROJECT_ROOT / "conf").is_dir() else Path.cwd()
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
            keep_stale=bool(c.config.get("keep_stale", False)),
        )
        for c in cells
    ]


def _bar(total: int, desc: str):
    from repro.harness.progress import SweepProgress  # tqdm on a terminal, plain lines elsewhere

    return SweepProgress(total, desc)


def cell_states(specs: Sequence[CellSpec]) -> list[tuple[str, list[str]]]:
    """missing | fresh | stale | damaged (+ reasons) of every spec's folder, against this checkout."""
    from repro.harness.cell import current_state

    return [current_state(CellStore(s.results_dir, s.exp_name, s.signature), s.config, False) for s in specs]


def check_writable(specs: Sequence[CellSpec]) -> None:
    """Every results folder the sweep writes is creatable and writable (ConfigError otherwise)."""
    import tempfile

    bad = []
    for root in sorted({str(Path(s.results_dir) / s.exp_name) for s in specs}):
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=root, prefix=".tmp-probe."):
                pass
        except OSError as exc:
            bad.append(f"results folder {root} is not writable: {exc.strerror or exc}")
    if bad:
        raise ConfigError("invalid configuration: nothing was run.\n  - " + "\n  - ".join(bad))


class _Triage:
    """Which specs run: fresh finished cells are skipped, a repeated signature runs once."""

    def __init__(self) -> None:
        self.outcomes: dict[int, CellOutcome] = {}
        self.first_of: dict[tuple[str, str, str], int] = {}

    def add(self, specs: Sequence[CellSpec], states: Sequence[tuple[str, list[str]]]) -> list[CellSpec]:
        todo: list[CellSpec] = []
        for spec, (state, why) in zip(specs, states):
            key = (spec.results_dir, spec.exp_name, spec.signature)
            if key in self.first_of:
                continue  # same signature as an earlier cell: filled in by `finish`
            self.first_of[key] = spec.index
            if state == "fresh" or (state == "stale" and spec.keep_stale):
                store = CellStore(spec.results_dir, spec.exp_name, spec.signature)
                self.outcomes[spec.index] = CellOutcome(
                    spec.index,
                    spec.signature,
                    "skipped",
                    str(store.dir),
                    summary=store.read_summary(),
                    extra={"stale": why} if state == "stale" else {},
                )
            else:
                todo.append(spec)
        return todo

    def finish(self, specs: Sequence[CellSpec]) -> list[CellOutcome]:
        outcomes = self.outcomes
        for spec in specs:  # duplicates share the first cell's outcome
            if spec.index not in outcomes:
                first = outcomes[self.first_of[(spec.results_dir, spec.exp_name, spec.signature)]]
                outcomes[spec.index] = CellOutcome(
                    spec.index,
                    spec.signature,
                    first.status if first.status == "failed" else "skipped",
                    first.dir,
                    summary=first.summary,
                    error=first.error,
                    extra={
                        "same_as_cell": first.index,
                        **({"stale": first.extra["stale"]} if "stale" in first.extra else {}),
                    },
                )
        return [outcomes[s.index] for s in specs]


class _Done:
    """The pool's on_done: record the outcome, warn once if W&B failed, advance the bar."""

    def __init__(self, outcomes: dict[int, CellOutcome], bar) -> None:
        self.outcomes, self.bar, self.warned = outcomes, bar, False

    def __call__(self, out: CellOutcome) -> None:
        self.outcomes[out.index] = out
        if out.extra.get("tracking_failed") and not self.warned:
            self.warned = True
            print(
                f"repro.run: warning: W&B tracking failed to start (cell {out.index}); tracking is off for "
                f"the rest of this sweep, local results are unaffected",
                file=sys.stderr,
                flush=True,
            )
        self.bar.update(failed=out.status == "failed")


def run_specs(
    specs: Sequence[CellSpec],
    n_jobs: int | None = None,
    desc: str = "cells",
    states: Sequence[tuple[str, list[str]]] | None = None,
) -> list[CellOutcome]:
    """Run every cell not finished (or stale, unless spec.keep_stale); outcomes in `specs` order."""
    from repro.harness.pool import run_cells

    states = list(states) if states is not None else cell_states(specs)
    triage = _Triage()
    todo = triage.add(specs, states)
    n_jobs = usable_cpus() if n_jobs is None else int(n_jobs)
    n_jobs = max(1, min(n_jobs, len(todo)))
    bar = _bar(len(todo), desc)
    try:
        run_cells(todo, n_jobs, _Done(triage.outcomes, bar))
    finally:
        bar.close()
    return triage.finish(specs)


def run_fed_specs(
    plan: Callable[..., None],
    n_jobs: int | None = None,
    desc: str = "cells",
    cost: Callable[[CellSpec], float] | None = None,
    after: Callable[[CellOutcome], Sequence[Any]] | None = None,
) -> list[CellOutcome]:
    """run_specs for specs that are still being planned: `plan(submit, put_tasks)` runs in a
    thread and calls submit(specs, states) once per batch (indices unique over all batches; it
    returns the specs that will run); the workers start at once and take each batch's
    unfinished cells as it comes, the highest `cost(spec)` first (the order never changes a
    result). put_tasks(tasks) and `after(outcome)` (in this process, per cell run; it returns
    tasks) give the workers pool Tasks, run before the cells still waiting. Outcomes in
    submission order.
    An exception in `plan` is re-raised here once the cells already submitted are done."""
    import threading

    from repro.harness.pool import Feed, run_cells

    triage, feed, submitted, failure = _Triage(), Feed(cost), [], []
    bar = _bar(0, desc)

    def submit(specs: Sequence[CellSpec], states: Sequence[tuple[str, list[str]]]) -> list[CellSpec]:
        todo = triage.add(specs, states)
        submitted.extend(specs)
        bar.grow(len(todo))
        feed.put(todo)
        return todo

    def planner() -> None:
        try:
            plan(submit, feed.put)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            failure.append(exc)
        finally:
            feed.close()

    n_jobs = max(1, usable_cpus() if n_jobs is None else int(n_jobs))
    thread = threading.Thread(target=planner, name="sweep-planner", daemon=True)
    thread.start()
    done = _Done(triage.outcomes, bar)

    def on_done(out: CellOutcome) -> None:
        done(out)
        if after is not None:
            feed.put(after(out))

    try:
        run_cells([], n_jobs, on_done, feed)
    finally:
        bar.close()
    thread.join()
    if failure:
        raise failure[0]
    return triage.finish(submitted)


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
        row["status"] = o.status + (
            " (stale)"
            if o.extra.get("stale")
            else " (was stale)"
            if o.extra.get("was_stale")
            else " (was damaged)"
            if o.extra.get("was_damaged")
            else ""
        )
        row["sig"] = o.signature
        summ = o.summary or {}
        keys = (
            [k for k in TABLE_METRICS if k in summ]
            or [k for k in THEORY_METRICS if k in summ]
            or [k for k, v in summ.items() if k != "provenance" and isinstance(v, (int, float))]
        )
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
    from repro.harness.cell import use_workload_memo

    use_workload_memo(True)  # validation builds each workload once; in-process cells reuse it
    try:
        return _run_sweep(params, overrides, compose_fn, n_jobs=n_jobs, dry_run=dry_run, out=out)
    finally:
        use_workload_memo(False)  # the memo lives for one sweep (run_cells' end turns it off too)


def _run_sweep(params, overrides, compose_fn, *, n_jobs, dry_run, out) -> int:
    out = out or sys.stdout
    from repro.harness.naming import with_derived_name

    overrides = with_derived_name(params, overrides, compose_fn)
    with pools_unbuilt() if dry_run else contextlib.nullcontext():  # a dry run builds no uncached pool
        cells = plan_cells(params, overrides, compose_fn)
    specs = make_specs(cells)
    exp = specs[0].exp_name if specs else "?"
    states = cell_states(specs)
    if dry_run:
        from repro.harness.dryrun import report

        report(cells, specs, states, out)
        return 0
    check_writable(specs)
    if n_jobs is None:
        n_jobs = cells[0].config.get("n_jobs") if cells else None
    stopped = None
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    clear_stop()
    signal.signal(signal.SIGTERM, _raise_stopped)  # scancel / kill: stop like Ctrl-C
    if previous[1] is signal.default_int_handler:  # Ctrl-C as before, but remembered (raise_interrupt)
        signal.signal(signal.SIGINT, raise_interrupt)
    outcomes: list[CellOutcome] = []
    try:
        outcomes = run_specs(specs, n_jobs=n_jobs, desc=exp, states=states)
    except (KeyboardInterrupt, Stopped) as exc:
        stopped = exc
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        clear_stop()
    root = Path(specs[0].results_dir) / exp if specs else Path(".")
    if stopped is not None:
        print(
            f"{exp}: stopped ({'Ctrl-C' if isinstance(stopped, KeyboardInterrupt) else stopped}); finished cells "
            f"are kept, the interrupted ones left no files; rerun to resume -> {root}",
            file=sys.stderr,
        )
        return 130 if isinstance(stopped, KeyboardInterrupt) else 143
    print(format_table(summary_table(cells, outcomes)), file=out)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ran", "copied", "skipped", "failed")}
    n_stale = sum(bool(o.extra.get("stale")) for o in outcomes)
    n_rerun = sum(bool(o.extra.get("was_stale")) for o in outcomes)
    kept = f", {n_stale} of them stale (kept: keep_stale=true)" if n_stale else ""
    n_damaged = sum(bool(o.extra.get("was_damaged")) for o in outcomes)
    rerun = ", ".join(
        x for x in (f"{n_rerun} were stale" if n_rerun else "", f"{n_damaged} were damaged" if n_damaged else "") if x
    )
    rerun = f" ({rerun})" if rerun else ""
    print(
        f"{exp}: {counts['ran']} ran{rerun}, {counts['copied']} copied (from a finished twin), {counts['skipped']} "
        f"skipped (finished{kept}), {counts['failed']} failed -> {root}",
        file=out,
    )
    for o in outcomes:
        if o.extra.get("was_damaged"):
            print(f"  cell {o.index} was damaged, recomputed: {o.dir}: {'; '.join(o.extra['was_damaged'])}", file=out)
        if o.status == "failed" and not o.extra.get("same_as_cell"):
            where = (
                f"(traceback: {o.extra['error_file']})"
                if o.extra.get("error_file")
                else f"(no error.txt could be written; last line: {(o.traceback or '').strip().splitlines()[-1:]})"
            )
            print(f"  cell {o.index} FAILED: {o.error}  {where}", file=out)
    return exit_code(outcomes)


def _raise_stopped(signum, frame):
    raise_stopped(signum, frame)
