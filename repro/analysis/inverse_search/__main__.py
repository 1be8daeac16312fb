"""python -m repro.analysis.inverse_search search|report|list

    search --claim ID [--claim ID ...] --trials N [--seeds 0,1,2] [--num-queries N]
           [--results-dir results] [--n-jobs 1] [--sampler-seed 0] [OVERRIDE ...]
        Run the claim's study (results/inverse_search/<ID>.journal) until it holds N trials
        (resumes; `--claim all`: every claim in turn). OVERRIDEs (key=value) go to every cell and
        are part of the study's identity, like --seeds and --num-queries.
    report [--results-dir results] [--figures-dir figures]
        results/inverse_search/report.md, trials.csv and figures/inverse_search.{png,pdf} from the journals
        (relative folders: from the project root, as results_dir everywhere).
    list
        The claims, with the paper's numbers.

Exit status: 0 done; 1 some trial failed (its cells' error.txt); 2 bad arguments or a study made
with other settings (nothing ran); 130 / 143 stopped by Ctrl-C / SIGTERM (finished cells and
trials are kept: rerun to resume).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds: comma-separated integers, not {text!r}") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds: distinct integers >= 0, not {text!r}")
    return seeds


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, not {text!r}")
    return n


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m repro.analysis.inverse_search",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search", help="run trials of one or more claims' studies")
    s.add_argument("--claim", action="append", required=True, help="a claim id (see `list`) or `all`; repeatable")
    s.add_argument("--trials", type=_positive, required=True, help="the study's total number of trials")
    s.add_argument("--seeds", type=_seeds, default=(0, 1, 2), help="seeds of every trial (default 0,1,2)")
    s.add_argument("--num-queries", type=_positive, default=None, help="queries per cell (default: the paper's)")
    s.add_argument("--results-dir", default="results")
    s.add_argument("--n-jobs", type=_positive, default=1, help="local processes per trial (default 1: in this one)")
    s.add_argument("--sampler-seed", type=int, default=0)
    s.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides for every cell")
    r = sub.add_parser("report", help="write report.md and the figure from the studies")
    r.add_argument("--results-dir", default="results")
    r.add_argument("--figures-dir", default="figures")
    sub.add_parser("list", help="the claims and the paper's numbers")
    return ap.parse_args(list(argv))


def _targets(names: Sequence[str], known: dict) -> list:
    if "all" in names:
        return list(known.values())
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown claim(s) {', '.join(bad)}; known: {', '.join(known)}, or all")
    return [known[n] for n in dict.fromkeys(names)]


def _search(a: argparse.Namespace, targets: dict, claims: dict) -> int:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import repro.harness.schema  # noqa: F401  (registers the structured schema before composition)
    from repro.analysis.inverse_search.search import Runner, SearchError, check_identity, journal_path, open_study
    from repro.confutil import CONF_DIR
    from repro.harness.cell import Stopped, clear_stop, raise_interrupt, raise_stopped
    from repro.harness.compose import GridComposer
    from repro.harness.freshness import use_project_cache
    from repro.harness.sweep import absolute_results_dir
    from repro.harness.validate import ConfigError

    try:
        chosen = _targets(a.claim, targets)
    except ValueError as exc:
        print(f"inverse_search: {exc}", file=sys.stderr)
        return 2
    use_project_cache()
    runner = Runner(absolute_results_dir(a.results_dir), a.seeds, a.num_queries, tuple(a.overrides), a.n_jobs)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        runner.composer = GridComposer("config")
        try:
            runner.prepare(chosen)  # every claim's starting cells compose and validate, or nothing runs
            for t in chosen:  # and every existing study was made with these settings
                path = journal_path(runner.results_dir, t.id)
                if path.is_file():
                    check_identity(open_study(path, t, create=False), runner.identity())
        except (ConfigError, SearchError) as exc:
            print(f"inverse_search: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # Hydra's composition errors (unknown key or option)
            print(f"inverse_search: invalid overrides: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        from repro.analysis.inverse_search.search import search

        previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        clear_stop()
        signal.signal(signal.SIGTERM, raise_stopped)
        if previous[1] is signal.default_int_handler:
            signal.signal(signal.SIGINT, raise_interrupt)
        try:
            for t in chosen:
                search(t, claims, runner, a.trials, a.sampler_seed)
        except (KeyboardInterrupt, Stopped) as exc:
            print("inverse_search: stopped; finished trials and cells are kept, rerun to resume", file=sys.stderr)
            return 130 if isinstance(exc, KeyboardInterrupt) else 143
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
            clear_stop()
    for line in runner.failed:
        print(f"inverse_search: FAILED {line}", file=sys.stderr)
    return 1 if runner.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        a = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: 2 on bad arguments, 0 on --help
        return int(exc.code or 0)
    from repro.analysis.inverse_search.claims import load_claims, targets as make_targets

    claims = load_claims()
    targets = make_targets(claims)
    if a.cmd == "list":
        for tid, t in targets.items():
            print(
                f"{tid:24s} {t.ours} vs {t.base}: paper {t.paper}; benchmarks {','.join(t.benchmarks)}"
                + (f"; fixed {' '.join(t.fixed)}" if t.fixed else "")
            )
        return 0
    if a.cmd == "report":
        from repro.analysis.inverse_search.report import write_report
        from repro.harness.sweep import absolute_results_dir

        for p in write_report(
            absolute_results_dir(a.results_dir), absolute_results_dir(a.figures_dir), claims, targets
        ):
            print(p)
        return 0
    return _search(a, targets, claims)


if __name__ == "__main__":
    sys.exit(main())
