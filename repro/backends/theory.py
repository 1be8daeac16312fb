"""Backend `theory`: one competitive-ratio cell on the trace replayer (repro.theory).

The cell is named in the config's `theory` node by (panel, x, policy[, quick]):
    panel   thm4 (single query, x = B - L + 1) | thm5 (batched, x = B - L - beta + 2)
    x       the x of the figure's axis (4 .. 1024 in the full grid)
    policy  lru | rlt | opt
    quick   the CLI's `--quick` grid (few phases and seeds; tests)
and its exact parameters (L, beta, phases, seeds, granularity) are looked up in
repro.theory.competitive_ratio.grid() — the one definition of the experiment, shared with
`python -m repro.theory.competitive_ratio`. A node that already holds full parameters
(it has `construction`) is passed through as is (`seed` defaulting to the top-level seed).

The run signature hashes these parameters only — not the unused serving config — exactly as
the theory CLI signs its cells, so both entry points fill the same
results/thm_competitive_ratio/<sig>/ folders and skip each other's finished cells.
The summary is the cell's result dict plus `params` (as the CLI writes it); no
requests.parquet. The top-level `seed` is not used by selector cells: the experiment fixes
one base seed per (panel, x).
"""

from __future__ import annotations

from typing import Callable, Mapping

from repro.confutil import to_plain

DETERMINISTIC = True  # the replayer: no clock, RNGs from the cell's seeds
PLAIN_CONFIG = True  # reads its `theory:` node as a plain mapping
SELECTOR_KEYS = {"panel", "x", "policy", "quick"}
X_KEY = {"thm4": "b_minus_l_plus_1", "thm5": "b_minus_l_minus_beta_plus_2"}


def theory_params(cfg: Mapping) -> dict:
    """The exact run_theory_cell parameters of a cell (ValueError with the choices if none)."""
    node = to_plain(cfg.get("theory"))
    if not isinstance(node, Mapping) or not node:
        raise ValueError(
            "backend=theory needs a `theory:` node (panel, x, policy) — see conf/exp/thm_competitive_ratio.yaml"
        )
    node = dict(node)
    if "construction" in node:  # explicit parameters
        node.setdefault("seed", to_plain(cfg.get("seed", 0)))
        return node
    unknown = set(node) - SELECTOR_KEYS
    if unknown:
        raise ValueError(f"theory: unknown key(s) {sorted(unknown)}; a cell is selected by {sorted(SELECTOR_KEYS)}")
    from repro.theory.competitive_ratio import grid

    panel, x, policy = node.get("panel"), node.get("x"), node.get("policy")
    cells = grid(bool(node.get("quick", False)))
    for params in cells:
        if params["construction"] == panel and params["policy"] == policy and params.get(X_KEY.get(panel, "")) == x:
            return dict(params)
    xs = sorted({p.get(X_KEY.get(panel, ""), None) for p in cells} - {None})
    raise ValueError(
        f"theory: no cell panel={panel!r} x={x!r} policy={policy!r} in the "
        f"{'quick' if node.get('quick') else 'full'} grid (panels thm4|thm5, policies lru|rlt|opt, x in {xs})"
    )


def replayed_paths(cfg: Mapping) -> int:
    """How many paths the cell replays, over all its seeds: its run time, to schedule it
    (0 if the cell is not valid; validation reports that)."""
    try:
        p = theory_params(cfg)
        runs = int(p.get("num_seeds", 1))
        if p["construction"] == "random":
            return runs * int(p["num_requests"])
        x = int(p[X_KEY[p["construction"]]])
        return runs * (int(p["num_phases"]) + 2) * x * int(p.get("beta", 1))  # thm5: beta paths per batch
    except (ValueError, KeyError, TypeError):
        return 0


def identity(cfg: Mapping) -> Mapping:
    return theory_params(cfg)


def validate_cell(cfg: Mapping) -> list[str]:
    try:
        params = theory_params(cfg)
        if "construction" in to_plain(cfg.get("theory")):  # explicit parameters: let theory check them
            from repro.theory import build_cell_trace

            build_cell_trace(params)
    except (ValueError, ImportError) as exc:
        return [f"theory: {exc}" if not str(exc).startswith("theory") else str(exc)]
    return []


def run_cell(cfg: Mapping, progress: Callable[[float], None] | None = None) -> dict:
    from repro.theory import run_theory_cell

    params = theory_params(cfg)
    result = dict(run_theory_cell(params))
    result["params"] = params
    if progress is not None:
        progress(1.0)
    return result
