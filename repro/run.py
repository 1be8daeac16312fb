"""`python -m repro.run +exp=NAME [overrides] [-m] [--dry-run]` — the Hydra entry point (thin).

Without -m: the experiment's grid (hydra.sweeper.params + sweep overrides on the command
line) is expanded, every cell composed and validated, then run on local cores (`n_jobs`)
with a progress bar, and a summary table is printed. With -m: Hydra's launcher (basic,
joblib, submitit/Slurm) runs one cell per job; the grid is validated first by
repro.harness.callbacks.ValidateGridCallback. Both write the same results/<exp>/<sig>/.

Exit status: 0 all cells finished (ran or skipped), 1 some cell failed, 2 invalid configuration
(nothing ran; Hydra's composition errors included), 130 / 143 stopped by Ctrl-C / SIGTERM.
Hydra's own flags work as usual (`--cfg job`, `--info`, `--help`). A relative results_dir is
taken from the project root; nothing is written in the current directory.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

STOPPED_LINE = "repro.run: stopped (Ctrl-C); finished cells are kept, rerun to resume"


def _stopped_while_starting(signum, frame):  # noqa: ARG001
    """Ctrl-C during the imports below (the first seconds): nothing has run, so end with one line."""
    sys.stderr.write(STOPPED_LINE + "\n")
    os._exit(130)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _stopped_while_starting)

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from repro import confutil  # noqa: E402
from repro.lifeline import die_with_sweep, mark_sweep_process, orphaned  # noqa: E402
import repro.harness.schema  # noqa: E402, F401  (registers the structured schema before composition)
from repro.harness.argv import PreparedArgv, prepare_argv  # noqa: E402

log = logging.getLogger("repro.run")
_state: dict = {"prepared": PreparedArgv(argv=[]), "exit_code": 0}


class CellFailed(RuntimeError):
    """Raised in a -m job whose cell failed, so that Hydra's launcher reports it."""


def _run_one_cell(cfg: DictConfig) -> dict | None:
    from repro.harness.cell import CellSpec, run_cell_spec
    from repro.harness.compose import cell_signature, hydra_compose, resolve
    from repro.harness.sweep import absolute_results_dir
    from repro.harness.validate import ConfigError, cell_errors

    hc = HydraConfig.get()
    config = resolve(hydra_compose(hc.job.config_name).canonicalize(cfg, list(hc.overrides.task)))
    errs = cell_errors(config, deep=False)  # deep checks ran for the whole grid at multirun start
    if errs:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errs))
    label = " ".join(o for o in hc.overrides.task if not o.startswith("exp="))
    spec = CellSpec(
        index=int(hc.job.num) if hc.job.get("num") is not None else 0,
        label=label or "(defaults)",
        config=config,
        signature=cell_signature(config),
        results_dir=absolute_results_dir(str(config["results_dir"])),
        exp_name=str(config["exp_name"]),
        keep_stale=bool(config.get("keep_stale", False)),
    )
    import signal

    from repro.harness.cell import Stopped, clear_stop, raise_stopped_once

    clear_stop()
    # scancel / kill: unwind the cell (no half-written files, lock released)
    previous = signal.signal(signal.SIGTERM, raise_stopped_once)
    try:
        out = run_cell_spec(spec)
    except Stopped:
        if orphaned():  # a local launcher's worker whose sweep is gone: nobody takes a result or sends work
            os._exit(143)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    log.info("cell %s %s: %s", spec.signature, out.status, out.dir)
    if out.status == "failed":
        raise CellFailed(f"cell {spec.signature} [{spec.label}] failed: {out.error} (see {out.dir}/error.txt)")
    return out.summary


def _run_grid(cfg: DictConfig) -> int:
    from repro.harness.compose import hydra_compose
    from repro.harness.sweep import run_sweep
    from repro.harness.validate import ConfigError

    hc = HydraConfig.get()
    params = OmegaConf.to_container(hc.sweeper.params, resolve=True) if hc.sweeper.get("params") is not None else None
    prepared: PreparedArgv = _state["prepared"]
    if not any(o.split("=", 1)[0].lstrip("+") == "exp" for o in prepared.overrides):
        print(
            f"repro.run: no +exp=NAME given: the default cell(s) go to {cfg.results_dir}/{cfg.exp_name}/ "
            f"(experiments: conf/exp/)",
            file=sys.stderr,
        )
    try:
        return run_sweep(params, prepared.overrides, hydra_compose(hc.job.config_name), dry_run=prepared.dry_run)
    except ConfigError as exc:
        print(f"repro.run: {exc}", file=sys.stderr)
        return 2


# Absolute, so that the app finds conf/ both as `python -m repro.run` and when main() is imported.
CONF_DIR = str(confutil.CONF_DIR)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _app(cfg: DictConfig) -> dict | None:
    die_with_sweep()  # a local launcher's worker (joblib's loky): first code of ours it runs
    _state["entered"] = True
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return _run_one_cell(cfg)
    _state["exit_code"] = _run_grid(cfg)
    return None


_interrupts = [0]


def _broken_local_yaml() -> str | None:
    """The first file of conf/local/ (per-site, hand-written, composed into every run) that is not
    YAML, in one line: Hydra would print the parser's traceback (89 lines)."""
    import yaml

    local = confutil.CONF_DIR / "local"
    for path in sorted(local.rglob("*.yaml")) if local.is_dir() else []:
        try:
            yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            return f"{path}: cannot be read ({exc})"
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            return f"{path} is not valid YAML ({where}{what}); fix it or move it away"
    return None


def _sweep_interrupt(signum, frame):
    _interrupts[0] += 1
    if _interrupts[0] > 1:
        sys.stderr.write(STOPPED_LINE + " (second Ctrl-C: not waiting for the launcher)\n")
        sys.stderr.flush()
        os._exit(130)
    from repro.harness.cell import raise_interrupt

    raise_interrupt(signum, frame)


def main(argv: list[str] | None = None) -> int:
    prepared = prepare_argv(list(sys.argv[1:] if argv is None else argv))
    if prepared.dry_run and prepared.multirun:
        print("repro.run: --dry-run lists the in-process grid; drop -m", file=sys.stderr)
        return 2
    _state["prepared"], _state["exit_code"], _state["entered"] = prepared, 0, False
    broken = _broken_local_yaml()
    if broken:
        print(f"repro.run: {broken}; nothing was run", file=sys.stderr)
        return 2
    # the workload cache and checksum memo live in the project, not in whatever cwd this runs from
    from repro.harness.freshness import use_project_cache

    use_project_cache()
    sys.argv = [sys.argv[0], *prepared.argv]
    from repro.harness.cell import Stopped, raise_stopped

    # -m: SIGTERM unwinds the launcher like Ctrl-C, so that it stops its workers (joblib's loky
    # workers outlived a parent that SIGTERM killed outright); each cell sets its own handler too.
    previous = signal.signal(signal.SIGTERM, raise_stopped) if prepared.multirun else None
    if prepared.multirun:
        mark_sweep_process()  # the launcher's local workers die with this process (repro/lifeline.py)
        from repro.harness.boot import arm_loky_workers

        arm_loky_workers()
    # Ctrl-C: KeyboardInterrupt (the in-process sweep installs its own handler while it runs); in a
    # -m sweep a second one ends the process at once (the launcher's workers die with it:
    # repro/lifeline.py), never waiting on a launcher's cleanup (loky's could hang).
    signal.signal(signal.SIGINT, _sweep_interrupt if prepared.multirun else signal.default_int_handler)
    _interrupts[0] = 0
    try:
        _app()
    except KeyboardInterrupt:
        print(STOPPED_LINE, file=sys.stderr)
        return 130
    except Stopped as exc:
        print(f"repro.run: stopped ({exc}); finished cells are kept, rerun to resume", file=sys.stderr)
        return 143
    except SystemExit as exc:
        # Hydra reports a config it cannot compose (unknown option, misspelt key, wrong type) and
        # exits 1 before our function runs; 1 means "a cell failed" here, 2 "invalid configuration".
        if exc.code == 1 and not _state["entered"]:
            return 2
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return int(_state["exit_code"])


if __name__ == "__main__":
    code = main()
    if code == 130:  # stopped: a further Ctrl-C must not turn the exit into a signal death (-2)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Python resets its own handlers at exit)
        if _state["prepared"].multirun:  # nor may a launcher's exit hooks hold it (loky's could hang)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    sys.exit(code)
