"""Figures of override runs, next to the paper's: results/fig5_request_rate+kv16384/ (written by
`python -m repro.run +exp=fig5_request_rate cluster.kv_cache_tokens=16384`, repro.harness.naming)
is drawn as figures/fig5_request_rate+kv16384.png with the paper figure's layout, and its title
and caption say what differs from the paper's setting (compared with the cells of the paper's
results/fig5_request_rate/). `python -m repro.figures fig5_request_rate` draws both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from repro.figures.knobs import differences
from repro.figures.load import _config_columns, load_cells

SEPARATOR = "+"


def paper_of(name: str) -> str | None:
    """The paper artefact an override folder belongs to (`fig5_request_rate+kv16384` -> fig5_request_rate)."""
    from repro.figures import ARTEFACTS

    base = name.split(SEPARATOR, 1)[0]
    return base if SEPARATOR in name and base in ARTEFACTS else None


def override_folders(results_dir: str | Path, name: str) -> list[str]:
    """The override folders of artefact `name` under results_dir, sorted."""
    root = Path(results_dir)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(name + SEPARATOR))


def what_differs(results_dir: str | Path, paper: str, folder: str) -> list[str]:
    df, base = load_cells(results_dir, folder), load_cells(results_dir, paper)
    if df.empty:
        return []
    if base.empty:
        return [f"see the folder name (no cells of results/{paper}/ to compare with)"]
    cols = [c for c in _config_columns(df) if c not in ("exp_name",)]
    return differences(base, df, cols)


def render(folder: str, results_dir: str | Path, figures_dir: str | Path) -> list[Path]:
    """Draw override folder `folder` like its paper artefact (generic layout for non-PerfFigure ones)."""
    from repro.figures import artefact
    from repro.figures.perf import PerfFigure

    paper = paper_of(folder)
    assert paper is not None, folder
    changed = what_differs(results_dir, paper, folder)
    figure = getattr(artefact(paper), "FIGURE", None)
    if not isinstance(figure, PerfFigure):
        from repro.figures import generic

        return generic.render(folder, results_dir, figures_dir)
    note = "Differs from the paper's setting: " + ("; ".join(changed) if changed else "nothing found") + "."
    extra = figure.caption_extra

    def caption_extra(df) -> str:
        return " ".join(x for x in (note, extra(df) if extra is not None else "") if x)

    title = figure.title + (f" — {changed[0]}" if len(changed) == 1 else " — with overrides" if changed else "")
    own = dataclasses.replace(figure, name=folder, exp=folder, title=title, caption_extra=caption_extra)
    return own.render(results_dir, figures_dir)


__all__ = ["override_folders", "paper_of", "render", "what_differs"]
