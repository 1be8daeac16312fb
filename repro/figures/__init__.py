"""Every table and plot of the paper, rendered from results/ only (never runs or imports the simulator).

    python -m repro.figures [NAME ...] [--results-dir results] [--figures-dir figures]
                            [--run-missing] [--check]

Any other experiment folder (the user's own `exp_name=...`) is drawn by repro.figures.generic.
One module per artefact (ARTEFACTS, in the paper's order); each has `NAME`, `EXP` (its
results/<EXP>/ folder, the same name as conf/exp/<EXP>.yaml) and
`render(results_dir, figures_dir) -> list[Path]`. Shared parts: load (the one results
loader), perf (the six-panel performance figures), tables, captions, style, claims (the
claims table) and reproduce (REPRODUCE.md's generated blocks and figures/README.md).
thm_competitive_ratio is the kvcache engineer's module, registered here as is. fig8/fig9 are
the paper's appendix figures as we read them; fig2_router_rules, regime_map and load_ladder go beyond
the paper (fig2_router_rules also reads results/fig2_main/). Protocols (issue 39): render_artefact
draws each artefact once per protocol its results folder holds, inside load.protocol_view, the
non-default protocol's files suffixed (repro.figures.protocols); claims and headline judge each
protocol apart.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ARTEFACTS: tuple[str, ...] = (
    "fig2_main",
    "fig3_models",
    "fig4_order",
    "fig5_request_rate",
    "fig6_workers",
    "fig7_cache_size",
    "tab2_ablation",
    "fig8_llama70b_benchmarks",
    "fig9_mixtral_benchmarks",
    "fig10_prefix_ratio",
    "fig11_num_queries",
    "fig12_output_len",
    "fig13_batch_size",
    "tab3_single_worker",
    "fig14_decay_interval",
    "thm_competitive_ratio",
    # beyond the paper
    "fig2_router_rules",
    "regime_map",
    "load_ladder",
    "mooncake_replay",
    "todays_baselines",
    "gap_ladder",
    "fig2_speed",
)


class ArtefactUnavailable(ImportError):
    """The artefact's module is not in this checkout (e.g. not merged yet)."""


def artefact(name: str) -> ModuleType:
    if name not in ARTEFACTS:
        raise KeyError(f"unknown figure/table {name!r}; known: {', '.join(ARTEFACTS)}")
    try:
        return importlib.import_module(f"repro.figures.{name}")
    except ModuleNotFoundError as exc:
        if exc.name in (f"repro.figures.{name}",):
            raise ArtefactUnavailable(f"repro/figures/{name}.py is not in this checkout yet") from exc
        raise


def experiment_of(name: str) -> str:
    """results/<exp>/ and conf/exp/<exp>.yaml of an artefact (the same name for every artefact, and
    for any other experiment folder, drawn by repro.figures.generic)."""
    return name


def experiments_read(name: str) -> tuple[str, ...]:
    """Every results/<exp>/ an artefact reads: its own, and its module's BASE_EXP if it has one."""
    base = getattr(artefact(name), "BASE_EXP", None) if name in ARTEFACTS else None
    return (experiment_of(name),) + ((base,) if base else ())


def render_artefact(name: str, results_dir, figures_dir) -> str | None:
    """Draw one artefact into figures_dir, once per protocol present in its results folder
    (repro.figures.protocols: the experiment's default protocol keeps the plain file names),
    logging a line; the problems that stopped it, or None. Module level, so that a sweep's
    worker process can draw a finished experiment's figures."""
    from pathlib import Path

    from repro.figures import overrides
    from repro.figures.load import protocols_present

    results_dir, figures_dir = Path(results_dir), Path(figures_dir)
    drawn = protocols_present(results_dir, experiment_of(name)) or [None]  # none: the loader says what is missing
    if name in ARTEFACTS and getattr(artefact(name), "SPANS_PROTOCOLS", False):
        drawn = [None]  # one figure over both protocols' cells (gap_ladder: text rungs up to the artifact)
    found = [_render_one(name, results_dir, figures_dir, p) for p in drawn]
    if name in ARTEFACTS:  # its override runs' figures go next to it (results/<name>+<changes>/)
        found += [render_artefact(f, results_dir, figures_dir) for f in overrides.override_folders(results_dir, name)]
    problems = [p for p in found if p is not None]
    return "; ".join(problems) if problems else None


def _render_one(name: str, results_dir, figures_dir, protocol: str | None) -> str | None:
    """render_artefact's drawing under one protocol (None: all cells, as the loader reads them)."""
    import sys
    import time

    from repro.figures import overrides
    from repro.figures.load import ResultsError, protocol_view
    from repro.figures.protocols import file_suffix, protocol_files

    t0 = time.perf_counter()
    label = name + (f" [protocol={protocol}]" if protocol is not None else "")
    try:
        with protocol_view(protocol), protocol_files(file_suffix(name, protocol)):
            if name in ARTEFACTS:
                paths = artefact(name).render(results_dir, figures_dir)
            elif overrides.paper_of(name) is not None:  # an override run of a paper experiment
                paths = overrides.render(name, results_dir, figures_dir)
            else:  # an experiment folder of no paper artefact: the user's own
                from repro.figures import generic

                paths = generic.render(name, results_dir, figures_dir)
            if name == "thm_competitive_ratio":
                from repro.figures.reproduce import thm_caption
                from repro.figures.style import write_text

                paths.append(write_text(figures_dir, f"{name}.caption.txt", thm_caption(results_dir) + "\n"))
    except (ArtefactUnavailable, ResultsError, FileNotFoundError, ValueError) as exc:
        print(f"[render] {label}: skipped — {exc}", file=sys.stderr, flush=True)
        return f"{label}: {exc}"
    print(f"[render] {label}: {len(paths)} file(s) in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return None


def draw_in_worker(name: str, results_dir, figures_dir) -> tuple[str | None, dict]:
    """render_artefact in a sweep's worker: (its problem, the results frames it loaded), the frames
    handed back so that the claims need not read those results again (repro.figures.load.remember)."""
    from repro.figures.load import memoized_loads

    with memoized_loads() as frames:
        return render_artefact(name, results_dir, figures_dir), dict(frames)


__all__ = [
    "ARTEFACTS",
    "ArtefactUnavailable",
    "artefact",
    "draw_in_worker",
    "experiment_of",
    "experiments_read",
    "render_artefact",
]
