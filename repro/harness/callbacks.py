"""Hydra callbacks of the harness (registered in conf/config.yaml under hydra.callbacks)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


class ValidateGridCallback(Callback):
    """`-m`: expand and validate every cell before the launcher starts (or submits) any job.

    Same expansion and checks as the in-process grid (repro.harness.sweep.plan_cells), so a
    bad cell of a Slurm sweep fails in the submitting shell with one clear message instead
    of in job 37 an hour later (exit status 2, nothing launched). Only for the basic sweeper
    (the one our exp files target).
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.harness.compose import hydra_compose
        from repro.harness.sweep import plan_cells
        from repro.harness.validate import ConfigError

        sweeper = OmegaConf.select(config, "hydra.sweeper._target_") or ""
        if not sweeper.endswith("BasicSweeper"):
            log.info("grid validation skipped: sweeper %s is not Hydra's basic sweeper", sweeper)
            return
        params = OmegaConf.select(config, "hydra.sweeper.params")
        params = OmegaConf.to_container(params, resolve=True) if params is not None else None
        overrides = list(OmegaConf.select(config, "hydra.overrides.task") or [])
        config_name = OmegaConf.select(config, "hydra.job.config_name") or "config"
        compose = hydra_compose(config_name)
        try:
            overrides = self._derived_name(config, params, overrides, compose)
            cells = plan_cells(params, overrides, compose)
        except ConfigError as exc:
            # Hydra turns callback exceptions into warnings and goes on; stop the sweep here.
            print(f"repro.run: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        partial = [c for c in cells if c.not_applied]
        if partial:
            print(
                f"repro.run: invalid configuration: with -m Hydra composes every job with every override, and "
                f"{' '.join(partial[0].not_applied)} is no knob of cell {partial[0].index} [{partial[0].label}] "
                f"({len(partial)} cell(s)); sweep policy= over the systems that have it, or drop -m (the in-process "
                f"grid applies it where it exists). Nothing was launched.",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)
        log.info("validated %d cell(s)", len(cells))
        from repro.harness.cell import begin_sweep

        begin_sweep()  # jobs run in this process (basic launcher): a failed W&B start is tried once
        self._multirun_start(cells)

    @staticmethod
    def _derived_name(config: DictConfig, params, overrides: list[str], compose) -> list[str]:
        """An override run's own folder (repro.harness.naming): exp_name='<derived>' joins the task
        overrides the sweeper is about to read, so every job writes there."""
        from omegaconf import read_write

        from repro.harness.naming import with_derived_name

        new = with_derived_name(params, overrides, compose)
        if len(new) > len(overrides):
            with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
                config.hydra.overrides.task.append(new[-1])
        return new

    # -- progress lines and the final table of -m runs (repro.harness.progress)
    def _multirun_start(self, cells) -> None:
        from repro.harness.progress import SweepProgress
        from repro.harness.sweep import make_specs

        from repro.harness.progress import summary_stamps

        self._cells, self._specs = cells, make_specs(cells)
        self._before = summary_stamps(self._specs)  # cells finished before the sweep: "skipped" at the end
        exp = self._specs[0].exp_name if self._specs else "?"
        self._progress = SweepProgress(len(cells), exp, tty=False)  # Hydra logs per job anyway

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        progress = getattr(self, "_progress", None)
        if progress is not None:
            from hydra.core.utils import JobStatus

            progress.update(failed=getattr(job_return, "status", None) == JobStatus.FAILED)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.harness.cell import end_sweep

        end_sweep()
        if getattr(self, "_specs", None) is None:
            return
        from repro.harness.progress import outcomes_from_store
        from repro.harness.sweep import format_table, summary_table

        outcomes = outcomes_from_store(self._specs, getattr(self, "_before", None))
        print(format_table(summary_table(self._cells, outcomes)), flush=True)
        counts = {s: sum(o.status == s for o in outcomes) for s in ("ran", "copied", "skipped", "failed", "missing")}
        print(
            f"{self._specs[0].exp_name}: {counts['ran'] + counts['copied'] + counts['skipped']} finished "
            f"({counts['ran']} ran, {counts['copied']} copied from a finished twin, {counts['skipped']} skipped), "
            f"{counts['failed']} failed, {counts['missing']} missing",
            flush=True,
        )
