"""What `python -m repro.results prune` removes: folders of a results tree that hold no finished cell.

- unfinished: a cell folder without summary.json or error.txt (a killed run, or what `git clean`
  leaves: the git-ignored requests.parquet and wandb/ of cells whose committed files were removed),
  unless a live process holds its lock (a run in progress);
- failed: error.txt and no summary.json (a rerun computes the cell again anyway);
- not in the grid: a finished cell of a project experiment whose signature the experiment's
  current grid (conf/exp/<exp>.yaml) does not produce: an older grid's cell, or an override run
  written into the paper's folder. Only for experiments whose grids are given (`grids`); the
  folders of the user's own exp_name and of override runs have no grid to compare with;
- an experiment folder left empty.
Only folders named like a signature (12 hex digits) are cells; anything else in an experiment
folder is left alone (and keeps the folder). Dry by default: the caller lists them; `remove`
deletes. Never follows a link out of the tree.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from repro.results.lock import CellLock
from repro.results.store import CellStore

KINDS = ("unfinished", "failed", "not in the grid", "empty experiment folder")
# Experiments whose folder is not their grid's: inverse_search holds the cells its trials drew.
NOT_GRIDS = ("inverse_search",)


@dataclass(frozen=True)
class Prunable:
    path: Path
    kind: str
    why: str = ""


_SIGNATURE = re.compile(r"^[0-9a-f]{12}$")  # repro.results.signature: 12 hex digits


def _cells(exp_dir: Path) -> list[Path]:
    """The cell folders (named like a signature; anything else is not ours to judge)."""
    return sorted(
        Path(e.path) for e in os.scandir(exp_dir) if e.is_dir(follow_symlinks=False) and _SIGNATURE.match(e.name)
    )


def scan(root: str | Path, exps: list[str], grids: Mapping[str, set[str]] | None = None) -> list[Prunable]:
    """Every prunable folder under root/<exp>/ for exp in exps (grids: {exp: signatures it produces})."""
    root = Path(root)
    out: list[Prunable] = []
    for exp in exps:
        exp_dir = root / exp
        if not exp_dir.is_dir() or exp_dir.is_symlink():
            continue
        cells = _cells(exp_dir)
        grid = (grids or {}).get(exp) if exp not in NOT_GRIDS else None
        kept = 0
        for d in cells:
            store = CellStore.at(d)
            if store.is_finished():
                if grid is not None and d.name not in grid:
                    out.append(Prunable(d, "not in the grid", f"conf/exp/{exp}.yaml does not produce {d.name}"))
                else:
                    kept += 1
            elif CellLock(d).held_by_other():
                kept += 1  # being computed now
            elif store.is_failed():
                out.append(Prunable(d, "failed", "error.txt, no summary.json"))
            else:
                held = sorted(e.name for e in os.scandir(d))
                out.append(
                    Prunable(
                        d,
                        "unfinished",
                        "holds " + (", ".join(held[:4]) or "nothing") + (" ..." if len(held) > 4 else ""),
                    )
                )
        others = [e for e in os.scandir(exp_dir) if not _SIGNATURE.match(e.name)]  # hidden files, notes: kept
        if kept == 0 and not others:
            out.append(Prunable(exp_dir, "empty experiment folder", "no finished cell left"))
    return out


def remove(found: list[Prunable]) -> int:
    """Delete the folders (cells first, then emptied experiment folders); returns how many."""
    n = 0
    for p in sorted(found, key=lambda p: p.kind == "empty experiment folder"):
        if p.path.is_symlink():
            continue
        shutil.rmtree(p.path, ignore_errors=True)
        n += not p.path.exists()
    return n
