"""`python -m repro.run ... --dry-run`: what a run would do with each cell, without doing it.

Each cell is one of:
  fresh      finished with this checkout's code, data and libraries: skipped
  stale      finished by other code/data/libraries: rerun (kept, and skipped, with keep_stale=true)
  damaged    its files do not match its manifest: rerun
  will-copy  not here, but finished and fresh in another experiment's folder (same signature, a
             deterministic backend): its files are copied, nothing is computed (repro.harness.cell)
  will-run   not here and no finished twin: computed
"""

from __future__ import annotations

import sys
from typing import Sequence

from repro.harness.cell import CellSpec
from repro.harness.grid import Cell

STATES = ("fresh", "stale", "damaged", "will-copy", "will-run")


def plan_state(spec: CellSpec, state: str, why: list[str]) -> tuple[str, list[str]]:
    """(one of STATES, its reasons) for a cell whose folder is in `state` (missing|fresh|stale|damaged)."""
    if state != "missing":
        return state, why
    from repro.harness.cell import _finished_twin

    twin = _finished_twin(spec)
    if twin is not None:
        return "will-copy", [f"from {twin[0].dir.parent.name}/{twin[0].dir.name}"]
    return "will-run", []


def report(
    cells: Sequence[Cell], specs: Sequence[CellSpec], states: Sequence[tuple[str, list[str]]], out=None
) -> dict[str, int]:
    """Print one line per cell and the counts; returns {state: count}."""
    out = out or sys.stdout
    counts = dict.fromkeys(STATES, 0)
    keep = bool(specs) and specs[0].keep_stale
    seen: dict[tuple, int] = {}
    for cell, spec, (state, why) in zip(cells, specs, states):
        key = (spec.results_dir, spec.exp_name, spec.signature)
        if key in seen:  # the sweep runs a repeated signature once
            shown, why = "same", [f"as cell {seen[key]}"]
        else:
            seen[key] = spec.index
            shown, why = plan_state(spec, state, why)
            counts[shown] += 1
        if cell.not_applied:
            why = [*why, f"not applied (no such knob in this system): {' '.join(cell.not_applied)}"]
        note = f"  ({'; '.join(why)})" if why else ""
        print(f"{spec.index:4d}  {spec.signature}  {shown:9s}  {spec.label}{note}", file=out)
    exp = specs[0].exp_name if specs else "?"
    n = {st: sum(state == st for state, _ in states) for st in ("fresh", "stale", "damaged")}
    to_run = len(specs) - n["fresh"] - (n["stale"] if keep else 0)
    kept = " (kept: keep_stale=true)" if keep else ""
    damaged = f", {n['damaged']} damaged" if n["damaged"] else ""
    print(
        f"{exp}: {len(specs)} cell(s), {n['fresh']} finished, {n['stale']} stale{kept}{damaged}, {to_run} to run: "
        f"{counts['will-copy']} will-copy (from a finished twin), {counts['will-run']} will-run"
        + ("" if keep else f", {counts['stale']} stale (rerun)")
        + (f", {counts['damaged']} damaged (rerun)" if counts["damaged"] else ""),
        file=out,
    )
    return counts
