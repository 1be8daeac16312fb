"""python -m repro.figures [NAME ...] [--results-dir results] [--figures-dir figures]
                          [--reproduce-md REPRODUCE.md] [--run-missing] [--check]

Default: render the named artefacts (all when none is named) from results/ only; a NAME that is no
paper artefact but an experiment folder of --results-dir (your own exp_name) is drawn as a bar
grid or a sweep strip picked from its cells (repro.figures.generic); an override run's folder
(results/<artefact>+<changes>/, repro.harness.naming) is drawn beside its artefact, in its layout, with
a caption saying what differs from the paper's setting (repro.figures.overrides). Only a whole build (no NAME)
whose artefacts all rendered then rewrites figures/claims.md, figures/README.md and REPRODUCE.md's
generated blocks (claims are computed from all results; REPRODUCE.md only when rendering the
repository's own results/, or the file given with --reproduce-md). --run-missing first runs the cells of every experiment whose results are missing or
incomplete, all experiments' cells in one worker pool of this process (the same cells and files
as `python -m repro.run +exp=NAME`; finished cells are skipped).
--check writes nothing: it recomputes the claims table and REPRODUCE.md's generated blocks and
exits 1 if they differ from the committed ones (CI, from committed summaries, no simulation).

Exit status: 0 all done; 1 some artefact could not be rendered / some experiment failed /
--check found a difference; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from repro.confutil import CONF_DIR
from repro.figures import ARTEFACTS, experiment_of, render_artefact
from repro.figures.load import memoized_loads

CONF_EXP = CONF_DIR / "exp"


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m repro.figures",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"artefacts (default: all): {', '.join(ARTEFACTS)}")
    ap.add_argument("--results-dir", default="results")
    ap.add_argument("--figures-dir", default="figures")
    ap.add_argument(
        "--reproduce-md",
        default=None,
        help="the file whose generated blocks are rewritten (default: the repository's REPRODUCE.md, "
        "and only when rendering the repository's own results/)",
    )
    ap.add_argument("--run-missing", action="store_true", help="run missing/incomplete experiments first")
    ap.add_argument("--check", action="store_true", help="compare the generated tables with the committed ones")
    ap.add_argument(
        "--tracking",
        choices=("offline", "online", "disabled"),
        default="offline",
        help="log this build's figures, tables and claims to one W&B run (repro.tracking.figures)",
    )
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- running experiments ---------------------------------------------------------------------
def _run_grid(exps: list[str], results_dir: Path, then=None) -> dict[str, int]:
    """All these experiments' unfinished cells in one pool of this process (exit code per experiment)."""
    from repro.harness.batch import run_experiments

    return run_experiments(exps, [f"results_dir={results_dir}"], then=then)


def drawing_tasks(names, results_dir: Path, figures_dir: Path, drawn: dict[str, str | None]):
    """then(exp) for run_missing: draw each artefact that reads only `exp` on the pool's workers
    as soon as exp's last cell is done (drawn[name] = its problem or None), so that the figures
    are drawn while other experiments still run instead of one after another at the end."""
    from repro.figures import draw_in_worker, experiments_read
    from repro.figures.load import remember
    from repro.harness.pool import Task

    def record(name, exp):
        def done(value, error):
            if error is not None:
                drawn[name] = f"{name}: drawing failed: {error.strip().splitlines()[-1]}"
                log(f"[render] {name}: failed in a worker\n{error}")
                return
            drawn[name], frames = value
            remember({k: df for k, df in frames.items() if k[1] == exp})  # only exp is known finished

        return done

    def then(exp: str):
        return [
            Task(draw_in_worker, (n, str(results_dir), str(figures_dir)), record(n, exp))
            for n in names
            if experiments_read(n) == (exp,)
        ]

    return then


def run_missing(names, results_dir: Path, then=None) -> list[str]:
    """Run what is missing; returns the problems (experiment: reason).

    Every experiment with a conf/exp/<exp>.yaml is planned in this process and all their
    unfinished cells run in one worker pool (repro.harness.batch: the same cells and files as
    `python -m repro.run +exp=NAME`, finished ones skipped), so no experiment pays its own
    start-up and both cores stay busy across experiments. `then`: see drawing_tasks."""
    problems = []
    grid: list[str] = []
    for name in names:
        exp = experiment_of(name)
        if exp in grid:
            continue
        if not (CONF_EXP / f"{exp}.yaml").is_file():
            problems.append(f"{exp}: conf/exp/{exp}.yaml does not exist (experiment not defined yet)")
            log(f"[run] {exp}: no conf/exp/{exp}.yaml — skipped")
            continue
        grid.append(exp)
    if grid:
        t0 = time.perf_counter()
        log(f"[run] {len(grid)} experiment(s) in one pool: {', '.join(grid)}")
        codes = _run_grid(grid, results_dir, then)
        log(f"[run] {len(grid)} experiment(s): done after {time.perf_counter() - t0:.0f} s wall")
        for exp in grid:
            if codes.get(exp, 1) != 0:
                problems.append(
                    f"{exp}: its grid ended with exit code {codes.get(exp, 1)} "
                    f"(as `python -m repro.run +exp={exp}` would)"
                )
    return problems


# -- rendering -------------------------------------------------------------------------------
def render(names, results_dir: Path, figures_dir: Path) -> list[str]:
    problems = []
    figures_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        problem = render_artefact(name, results_dir, figures_dir)
        if problem is not None:
            problems.append(problem)
    return problems


def generated(results_dir: Path):
    from repro.figures import claims, reproduce

    table = claims.evaluate(results_dir)
    from repro.figures.headline import headline_block

    blocks = {
        "figures": reproduce.figures_table(results_dir, table),
        "headline": headline_block(table),
        "claims": reproduce.claims_block(table),
    }
    return table, blocks, reproduce.claims_file(table)


def write_generated(results_dir: Path, figures_dir: Path, reproduce_md: Path | None) -> None:
    from repro.figures import reproduce
    from repro.figures.style import write_text
    from repro.fileio import write_atomic

    table, blocks, claims_md = generated(results_dir)
    write_text(figures_dir, "claims.md", claims_md)
    write_text(figures_dir, "README.md", reproduce.index(results_dir, figures_dir))
    if reproduce_md is None:
        log(
            f"[claims] {results_dir} is not the repository's results/: REPRODUCE.md left alone "
            f"(--reproduce-md FILE to write one)"
        )
    elif reproduce_md.is_file():
        text = reproduce_md.read_text()
        for name, body in blocks.items():
            text = reproduce.replace_block(text, name, body)
        write_atomic(reproduce_md, text)
    else:
        log(f"[claims] {reproduce_md} does not exist: only figures/claims.md written")
    from repro.figures.claims import protocols_of, verdict_counts

    log(f"[claims] {len(table)} claims: " + "; ".join(f"{p}: {verdict_counts(table, p)}" for p in protocols_of(table)))
    return table


def check(results_dir: Path, figures_dir: Path, reproduce_md: Path) -> int:
    from repro.figures import reproduce

    _, blocks, claims_md = generated(results_dir)
    pairs = [(figures_dir / "claims.md", claims_md, None)]
    pairs += [(reproduce_md, body, name) for name, body in blocks.items()]
    bad = 0
    for path, want, block in pairs:
        where = f"{path}" + (f" [{block}]" if block else "")
        if not path.is_file():
            log(f"[check] {where}: missing")
            bad += 1
            continue
        text = path.read_text()
        try:
            have = reproduce.read_block(text, block) if block else text
        except reproduce.MarkerError as exc:
            log(f"[check] {where}: {exc}")
            bad += 1
            continue
        if have != want:
            bad += 1
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), "committed", "recomputed", lineterm="", n=0
            )
            log(f"[check] {where}: differs from the results\n" + "\n".join(list(diff)[:40]))
        else:
            log(f"[check] {where}: up to date")
    return 1 if bad else 0


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    from repro.harness.freshness import use_project_cache

    use_project_cache()  # staleness of the cells read (captions) hashes data files: memo in the project
    unknown = [n for n in a.names if n not in ARTEFACTS and not (Path(a.results_dir) / n).is_dir()]
    if unknown:
        log(
            f"unknown figure/table {unknown}, and no such experiment folder in {a.results_dir}; known: "
            f"{', '.join(ARTEFACTS)} (or any results folder's experiment, drawn by repro.figures.generic)"
        )
        return 2
    from repro.harness.validate import output_dir_error

    for bad_dir in (output_dir_error(a.figures_dir, "--figures-dir"), output_dir_error(a.results_dir, "--results-dir")):
        if bad_dir is not None:
            log(bad_dir)
            return 2
    if a.check and a.run_missing:
        log("--check compares committed results; it cannot be combined with --run-missing")
        return 2
    names = a.names or list(ARTEFACTS)
    results_dir, figures_dir = Path(a.results_dir).resolve(), Path(a.figures_dir)
    repo = CONF_EXP.parent.parent
    if a.reproduce_md is not None:
        reproduce_md: Path | None = Path(a.reproduce_md)
    elif results_dir == (repo / "results").resolve():
        reproduce_md = repo / "REPRODUCE.md"
    else:  # other results never overwrite the repository's REPRODUCE.md
        reproduce_md = None
    if a.check:
        with memoized_loads():
            return check(results_dir, figures_dir, reproduce_md or repo / "REPRODUCE.md")
    t0 = time.perf_counter()
    drawn: dict[str, str | None] = {}  # drawn while the run went on: name -> its problem or None
    # memo: an experiment's frames enter it only once its cells are done (drawing_tasks); after the
    # run, results/ does not change
    with memoized_loads():
        if a.run_missing:
            figures_dir.mkdir(parents=True, exist_ok=True)
            problems = run_missing(names, results_dir, drawing_tasks(names, results_dir, figures_dir, drawn))
        else:
            problems = []
        t_run = time.perf_counter() - t0
        problems += [p for p in drawn.values() if p is not None]
        problems += render([n for n in names if n not in drawn], results_dir, figures_dir)
        claims_table = None
        if a.names:  # the claims and REPRODUCE.md read every paper experiment: only a whole build writes them
            log(
                "[claims] named artefacts only: claims.md, figures/README.md and REPRODUCE.md left alone "
                "(`make figures` writes them)"
            )
        elif problems:  # never "no data" for what failed to render
            log(
                f"[claims] {len(problems)} artefact(s) failed: claims.md, figures/README.md and REPRODUCE.md left alone"
            )
        else:
            claims_table = write_generated(results_dir, figures_dir, reproduce_md)
    if a.tracking != "disabled":
        from repro.tracking.figures import log_figures_run

        run_dir = log_figures_run(results_dir, figures_dir, names, claims_table, mode=a.tracking)
        log(f"[wandb] figures run ({a.tracking}): {run_dir or 'not written (see the warning)'}")
    log(
        f"[done] {'run ' + format(t_run, '.0f') + ' s, ' if a.run_missing else ''}"
        f"total {time.perf_counter() - t0:.0f} s wall"
    )
    for p in problems:
        log(f"[problem] {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
