"""One Optuna study per claim; every trial runs its cells through the harness's cell path.

A trial draws a setting (space.py), composes one cell per (system, seed) from conf/exp/inverse_search.yaml
plus the setting's overrides (repro.harness.compose, as `python -m repro.run` composes a grid),
validates them all, and runs them with repro.harness.sweep.run_specs: signatures, cell folders
results/inverse_search/<sig>/, fresh cells skipped, locks, twins copied. Its value is the claim's
advantage from the seed means of both systems (claims.py). The study lives in a journal file,
results/inverse_search/<claim>.journal (Optuna's JournalStorage; its file lock works on NFS), so
that several processes (a Slurm array) can share it.

Determinism: trial k is drawn by a TPE sampler seeded from (sampler seed, study, k) over the trials
before it, so a search stopped and resumed draws what one uninterrupted run draws. With several
processes on one journal the order in which trials finish decides what later ones see: the
trials differ run to run, each trial's cells do not.
`--trials N` is the study's total: a process asks for trials while fewer than N are finished or
running. A trial stopped by Ctrl-C / SIGTERM, or left RUNNING by a process that died (on this
host: its pid is gone; elsewhere: older than STALE_AFTER_S), is marked failed and does not
count; its finished cells stay and are skipped when the setting comes again.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Sequence

from repro.analysis.inverse_search.claims import Target
from repro.analysis.inverse_search.space import RATE_HALVES, Setting, default_params, suggest

EXP = "inverse_search"
SPACE_VERSION = 2  # part of a study's identity: a changed space is a new study
STALE_AFTER_S = 2 * 3600.0  # a RUNNING trial of another host older than this is abandoned
METRICS = ("latency_p50_s", "ttft_p50_s", "hit_rate", "throughput_rps", "latency_p95_s", "ttft_p95_s")
REGIME_FIELDS = ("regime", "util_max", "wait_share_p50")  # read with .get: summaries may predate them


class SearchError(ValueError):
    """Invalid arguments or a study made with other settings (exit 2, nothing ran)."""


def journal_path(results_dir: str | Path, target_id: str) -> Path:
    return Path(results_dir) / EXP / f"{target_id}.journal"


def sampler_seed(seed: int, study: str, number: int) -> int:
    """Trial `number`'s sampler seed: the study's name takes part, so that the studies' random first
    trials explore different settings (the same draws would only give the same cells again)."""
    import zlib

    import numpy as np

    return int(np.random.SeedSequence([seed, zlib.crc32(study.encode()), number]).generate_state(1)[0])


def make_sampler(seed: int, study: str, number: int):
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=sampler_seed(seed, study, number), constant_liar=True)


def open_study(path: Path, target: Target, *, create: bool):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not create and not path.is_file():
        raise FileNotFoundError(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(path)))
    if create:
        return optuna.create_study(
            study_name=target.id, storage=storage, direction=target.direction, load_if_exists=True
        )
    return optuna.load_study(study_name=target.id, storage=storage)


@dataclass
class Runner:
    """Composes, validates and runs a trial's cells (inside an initialised Hydra config dir)."""

    results_dir: str
    seeds: tuple[int, ...]
    num_queries: int | None
    extra: tuple[str, ...]
    n_jobs: int = 1
    composer: Any = None
    failed: list[str] = field(default_factory=list)
    _defaults: dict = field(default_factory=dict)

    def base(self) -> list[str]:
        nq = [] if self.num_queries is None else [f"workload.num_queries={self.num_queries}"]
        return [f"exp={EXP}", f"results_dir={self.results_dir}", *nq]

    def cells(self, target: Target, setting: Setting | None = None, workload: str | None = None) -> list:
        """One Cell per (system, seed), composed and validated (ConfigError otherwise). No setting:
        the paper's defaults with `workload` (the study's first trial)."""
        from repro.harness.cell import use_workload_memo
        from repro.harness.compose import compose_cells
        from repro.harness.grid import Cell
        from repro.harness.validate import validate_configs

        cells = []
        for i, (policy, seed) in enumerate(product((target.base, target.ours), self.seeds)):
            if setting is None:
                ov = [*self.base(), f"workload={workload}", *target.fixed, f"policy={policy}", f"seed={seed}"]
            else:
                ov = [*self.base(), *setting.overrides(policy, seed)]
            cells.append(Cell(index=i, overrides=[*ov, *self.extra], swept={"policy": policy, "seed": str(seed)}))
        compose_cells(cells, self.composer)
        use_workload_memo(True)  # as run_sweep: validation builds each workload once, the cells (n_jobs 1) reuse it
        validate_configs(((f"{c.label}", c.config) for c in cells), deep=True)
        return cells

    def default_cells(self, target: Target) -> list:
        """The study's starting point (the paper's defaults on its first benchmark), composed once."""
        key = (target.base, target.ours, target.benchmarks[0], target.fixed)
        if key not in self._defaults:
            self._defaults[key] = self.cells(target, None, target.benchmarks[0])
        return self._defaults[key]

    def prepare(self, targets: Sequence[Target]) -> None:
        """Compose and validate every target's default cells (ConfigError: bad extra overrides, before
        any cell runs) and fix the query count to the composed one when none was given."""
        for t in targets:
            cells = self.default_cells(t)
            if self.num_queries is None:
                self.num_queries = int(cells[0].config["workload"]["num_queries"])

    def identity(self) -> dict:
        return {
            "seeds": list(self.seeds),
            "num_queries": self.num_queries,
            "extra": list(self.extra),
            "space": SPACE_VERSION,
        }

    def run(self, cells: Sequence) -> list:
        from repro.harness.sweep import check_writable, make_specs, run_specs

        specs = make_specs(cells)
        check_writable(specs)
        return run_specs(specs, n_jobs=self.n_jobs, desc="trial")


def _setting_record(setting: Setting) -> dict:
    """The trial's setting as key -> value (per-system keys under the policy's name)."""

    def split(ovs):
        return dict(o.split("=", 1) for o in ovs if not o.startswith(("workload.num_queries=",)))

    out: dict[str, Any] = split(setting.common)
    for policy, ovs in setting.per_system.items():
        if ovs:
            out[policy] = split(ovs)
    return out


def evaluate(target: Target, claims, cells: Sequence, outcomes: Sequence) -> tuple[float, dict]:
    """(objective, record): both systems' seed means -> the advantages of every metric -> the value."""
    rows = []
    for c, o in zip(cells, outcomes):
        s = o.summary or {}
        rows.append(
            {
                "policy": c.swept["policy"],
                "seed": int(c.swept["seed"]),
                "signature": o.signature,
                "status": o.status,
                **{m: s.get(m) for m in METRICS},
                **{k: s[k] for k in REGIME_FIELDS if k in s},
            }
        )

    def mean(policy: str, metric: str) -> float:
        vals = [r[metric] for r in rows if r["policy"] == policy]
        return math.nan if any(v is None for v in vals) else float(sum(vals) / len(vals))

    from repro.analysis.inverse_search.claims import advantage

    adv = {m: advantage(m, mean(target.base, m), mean(target.ours, m)) for m in METRICS}
    return target.value(claims, adv), {"cells": rows, "advantages": adv}


def _abandon_dead(study) -> list[int]:
    """Fail the RUNNING trials whose process is gone (this host) or that are too old (elsewhere)."""
    from optuna.trial import TrialState

    from repro.results.lock import _boot_id, _pid_alive

    dead = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner") or {}
        if owner.get("host") == socket.gethostname() and owner.get("boot_id") == _boot_id():
            gone = not _pid_alive(int(owner.get("pid", -1)), str(owner.get("start", "")))
        else:
            gone = t.datetime_start is not None and time.time() - t.datetime_start.timestamp() > STALE_AFTER_S
        if gone:
            try:
                study.tell(t.number, state=TrialState.FAIL)
                dead.append(t.number)
            except Exception:  # another process did it first
                pass
    return dead


def counted(study) -> int:
    """Trials that count toward --trials: finished (complete, or failed with an error of their own)
    or running; not the stopped and abandoned ones, nor the enqueued (WAITING) first trials."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.RUNNING):
            n += 1
        elif t.state == TrialState.FAIL and "error" in t.user_attrs:
            n += 1
    return n


def check_identity(study, identity: dict) -> None:
    """A study's objective is one definition: seeds, query count, extra overrides, space version."""
    have = study.user_attrs.get("identity")
    if have is None:
        study.set_user_attr("identity", identity)
    elif have != identity:
        raise SearchError(
            f"study {study.study_name} was made with {json.dumps(have, sort_keys=True)}, "
            f"not {json.dumps(identity, sort_keys=True)}: use those settings or another --results-dir"
        )


def run_trial(study, target: Target, claims, runner: Runner, seed: int) -> tuple[Any, float | None, str]:
    """Ask, draw, run, tell one trial; (trial, value or None, one line for the log)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from repro.harness.validate import ConfigError
    from repro.results.lock import owner_record

    trial = study.ask()
    study.sampler = make_sampler(seed, target.id, trial.number)  # before any draw: trial k draws from (seed, study, k)
    trial.set_user_attr("owner", owner_record())
    t0 = time.perf_counter()
    try:
        setting = suggest(trial, target, int(runner.num_queries or 0))
        trial.set_user_attr("setting", _setting_record(setting))
        try:
            cells = runner.cells(target, setting)
        except ConfigError as exc:
            trial.set_user_attr("error", f"invalid setting: {exc}")
            study.tell(trial, state=TrialState.FAIL)
            runner.failed.append(f"{target.id} trial {trial.number}: invalid setting")
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith("- ")), str(exc))
            return trial, None, f"invalid setting: {first}"
        outcomes = runner.run(cells)
    except BaseException:  # Ctrl-C, SIGTERM: this trial does not count; its finished cells stay
        with contextlib.suppress(UpdateFinishedTrialError):
            trial.set_user_attr("stopped", True)
            study.tell(trial, state=TrialState.FAIL)
        raise
    try:
        return _record(study, trial, target, claims, runner, cells, outcomes, t0)
    except UpdateFinishedTrialError:  # another process took it for abandoned (STALE_AFTER_S) and failed it
        return trial, None, "failed meanwhile by another process as abandoned (not counted; its cells are kept)"


def _record(study, trial, target: Target, claims, runner: Runner, cells, outcomes, t0: float):
    from optuna.trial import TrialState

    statuses = [o.status for o in outcomes]
    failed = [o for o in outcomes if o.status == "failed"]
    value, record = evaluate(target, claims, cells, outcomes)
    for k, v in record.items():
        trial.set_user_attr(k, v)
    took = f"{time.perf_counter() - t0:.1f} s, cells: " + ", ".join(
        f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)
    )
    if failed or math.isnan(value):
        why = f"cell {failed[0].signature} failed: {failed[0].error}" if failed else "ratio undefined"
        trial.set_user_attr("error", why)
        study.tell(trial, state=TrialState.FAIL)
        runner.failed.append(f"{target.id} trial {trial.number}: {why}")
        return trial, None, f"FAILED ({why}; {took})"
    study.tell(trial, value)
    return trial, value, took


def search(target: Target, claims, runner: Runner, trials: int, seed: int, out=sys.stdout) -> None:
    """Run trials of `target`'s study until it holds `trials` (resumes an existing journal)."""
    path = journal_path(runner.results_dir, target.id)
    study = open_study(path, target, create=True)
    check_identity(study, runner.identity())
    if not study.get_trials(deepcopy=False):
        # the paper's defaults first (trial 0), then the same at both ends of the paper's rate range
        # (trials 1, 2): the load ladder finds the largest ratios at the lightest load
        paper = default_params({c.swept["policy"]: c.config for c in runner.default_cells(target)})
        for rate_x2 in (paper["request_rate_x2"], *RATE_HALVES):
            study.enqueue_trial({**paper, "request_rate_x2": rate_x2}, skip_if_exists=True)
    for number in _abandon_dead(study):
        print(f"[{target.id}] trial {number}: its process is gone; marked failed (not counted)", file=out, flush=True)
    asked = 0
    while counted(study) < trials and asked < trials:  # at most N asks: uncounted trials cannot loop forever
        asked += 1
        trial, value, note = run_trial(study, target, claims, runner, seed)
        best = _best(study)
        shown = target.printed(value) if value is not None else "-"
        best_txt = f"best {target.printed(best.value)} (trial {best.number})" if best is not None else "no best yet"
        print(f"[{target.id}] trial {trial.number}: {shown}; {best_txt}; {note}", file=out, flush=True)
        _abandon_dead(study)
    print(f"[{target.id}] {counted(study)} trial(s) in {path}", file=out, flush=True)


def _best(study):
    try:
        return study.best_trial
    except ValueError:  # no complete trial yet
        return None
