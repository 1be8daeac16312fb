"""Router and eviction knobs set on the command line while the grid sweeps systems.

`policy=cache_aware_lru,lbgr_rlt router.generation=le_0_2_3`: `generation` is a key of the
cache-aware router only. Each cell gets the `router.<key>=` / `eviction.<key>=` overrides its own
router / eviction has (its composed defaults hold the key) and leaves out the others, listed in
`Cell.not_applied` (the dry run and the run table show them). A knob that no cell's system has is
left in, so that Hydra's own error ("Key 'x' is not in struct") still reports a misspelt key.
A `+router.<key>=` (adding a key) is never left out. With `-m` Hydra's launcher composes every
job with every override, so such a grid is refused before any job starts (repro.harness.callbacks).
"""

from __future__ import annotations

from typing import Any, Sequence

from repro.harness.grid import Cell


def apply_where_known(cells: Sequence[Cell], compose_fn: Any) -> None:
    """Drop from each cell the system knobs its router/eviction lacks, if another cell has them."""
    missing_of = getattr(compose_fn, "missing_system_knobs", None)
    if missing_of is None or not cells:
        return
    missing: dict[int, set[str]] = {}
    for c in cells:
        try:
            missing[c.index] = set(missing_of(c.overrides))
        except Exception:  # a composition error: compose_cells reports it for this cell
            missing[c.index] = set()
    unknown_to_all = set.intersection(*missing.values())
    for c in cells:
        drop = missing[c.index] - unknown_to_all
        if drop:
            c.overrides = [o for o in c.overrides if o not in drop]
            c.not_applied = sorted(drop)


def system_knob(token: str) -> bool:
    """A plain `router.<key>=v` / `eviction.<key>=v` override (not `+`, `++` or `~`)."""
    key, sep, _ = token.partition("=")
    return bool(sep) and not key.startswith(("+", "~")) and key.startswith(("router.", "eviction."))


__all__ = ["apply_where_known", "system_knob"]
