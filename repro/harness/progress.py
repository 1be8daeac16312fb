"""Sweep progress a person sees everywhere: the tqdm bar on a terminal, plain lines elsewhere.

Slurm logs, nohup and CI are not terminals: there tqdm shows nothing until the end, so a sweep
prints one line per finished cell instead (at most one per `min_interval_s`, plus always the
last one and any failure):

    [fig2_main] 12/72 cells done, 0 failed, 9 s elapsed, ETA 45 s

`python -m repro.run -m` (one Hydra job per cell) gets the same lines from the Hydra callback
and the sweep's summary table at the end (`outcomes_from_store` reads the cells' folders).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence, TextIO


def _eta(done: int, total: int, elapsed: float) -> str:
    if done == 0 or done >= total:
        return "-"
    return f"{elapsed / done * (total - done):.0f} s"


class SweepProgress:
    """update(failed=...) once per finished cell; close() at the end."""

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        stream: TextIO | None = None,
        min_interval_s: float = 1.0,
        tty: bool | None = None,
        done: int = 0,
    ):
        self.total, self.desc = int(total), desc
        self.stream = stream or sys.stderr
        self.done, self.failed = int(done), 0
        self.min_interval_s = float(min_interval_s)
        self._t0 = time.monotonic()
        self._last = -float("inf")
        if tty is None:
            tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar = None
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, initial=self.done, desc=desc, unit="cell", file=self.stream, dynamic_ncols=True
            )

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        return (
            f"[{self.desc}] {self.done}/{self.total} cells done, {self.failed} failed, "
            f"{elapsed:.0f} s elapsed, ETA {_eta(self.done, self.total, elapsed)}"
        )

    def update(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += bool(failed)
        if self._bar is not None:
            self._bar.set_postfix(failed=self.failed)
            self._bar.update()
            return
        now = time.monotonic()
        if failed or self.done >= self.total or now - self._last >= self.min_interval_s:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def grow(self, n: int) -> None:
        """n more cells to run (a sweep whose later cells are still being planned)."""
        self.total += int(n)
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def summary_stamps(specs: Sequence[Any]) -> dict[str, tuple | None]:
    """Each planned cell's summary.json stat identity (None: none) when a -m sweep starts: a cell
    whose summary is still that one at the end was skipped, not run."""
    from repro.codehash import stat_identity
    from repro.results import CellStore

    out: dict[str, tuple | None] = {}
    for s in specs:
        try:
            out[s.signature] = stat_identity(CellStore(s.results_dir, s.exp_name, s.signature).summary_path.stat())
        except OSError:
            out[s.signature] = None
    return out


def _finished_status(store: Any, before: tuple | None) -> str:
    """ran | copied (from a twin: timings.json names it) | skipped (its summary predates the sweep)."""
    from repro.codehash import stat_identity

    try:
        if before is not None and stat_identity(store.summary_path.stat()) == before:
            return "skipped"
        timings = store.read_json(store.TIMINGS)
    except Exception:  # unreadable timings: it was still finished by this sweep
        return "ran"
    return "copied" if (timings.get("harness") or {}).get("reused_from") else "ran"


def outcomes_from_store(specs: Sequence[Any], before: dict[str, tuple | None] | None = None) -> list:
    """CellOutcome of each planned cell from its folder: finished (summary.json: ran, copied, or
    skipped when `before`, the summary_stamps taken at the start, shows it unchanged), failed
    (error.txt) or missing — for the -m table, where the jobs ran elsewhere."""
    from repro.harness.cell import CellOutcome
    from repro.results import CellStore

    out = []
    for s in specs:
        store = CellStore(s.results_dir, s.exp_name, s.signature)
        if store.is_finished():
            status = _finished_status(store, (before or {}).get(s.signature))
            out.append(CellOutcome(s.index, s.signature, status, str(store.dir), summary=store.read_summary()))
        else:
            failed = store.path(store.ERROR).is_file()
            out.append(
                CellOutcome(
                    s.index,
                    s.signature,
                    "failed" if failed else "missing",
                    str(store.dir),
                    error="see error.txt" if failed else "no result",
                )
            )
    return out


__all__ = ["SweepProgress", "outcomes_from_store", "summary_stamps"]
