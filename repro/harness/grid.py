"""Grid expansion: the same cells Hydra's basic sweeper would launch with `-m`.

The grid of an experiment lives in `hydra.sweeper.params` (conf/exp/<name>.yaml); the
command line adds overrides (which may themselves be sweeps: `seed=0,1`). Expansion uses
Hydra's own override parser and the basic sweeper's split (repro.harness.hydra_adapter), fed in
the very order the basic sweeper uses (sweeper params first, then the command-line overrides; a
later override of the same key replaces the earlier one), so that `python -m repro.run +exp=X`
and `python -m repro.run -m +exp=X` compose exactly the same cells, with the same overrides in
the same order — hence the same resolved configs and the same run signatures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser

from repro.harness.hydra_adapter import split_sweep


@dataclass
class Cell:
    """One grid cell: its index in the sweep, its overrides and (after composition) its config."""

    index: int
    overrides: list[str]
    config: dict | None = None  # resolved, plain containers
    signature: str | None = None
    swept: dict[str, str] = field(default_factory=dict)  # key -> value of the keys that vary
    # router./eviction. overrides left out: this cell's system has no such knob (repro.harness.knobs)
    not_applied: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        shown = [f"{k}={v}" for k, v in self.swept.items()] or self.overrides
        return " ".join(shown) if shown else "(defaults)"


def sweeper_arguments(params: Mapping[str, Any] | None, overrides: Sequence[str]) -> list[str]:
    """Sweeper params (as `key=value` strings, in order) followed by the command-line overrides."""
    args = [f"{k}={v}" for k, v in (params or {}).items()]
    args.extend(overrides)
    return args


def expand_grid(params: Mapping[str, Any] | None, overrides: Sequence[str], config_loader: Any = None) -> list[Cell]:
    """Cells of the cartesian product, in the basic sweeper's order (last key varies fastest)."""
    parser = OverridesParser.create(config_loader=config_loader)
    parsed = parser.parse_overrides(sweeper_arguments(params, overrides))
    batches = split_sweep(parsed)
    values: dict[str, set[str]] = {}
    for job in batches:
        for item in job:
            key, _, value = item.partition("=")
            values.setdefault(key, set()).add(value)
    swept_keys = {k for k, v in values.items() if len(v) > 1}
    cells = []
    for i, job in enumerate(batches):
        swept = {}
        for item in job:
            key, _, value = item.partition("=")
            if key in swept_keys:
                swept[key] = value
        cells.append(Cell(index=i, overrides=list(job), swept=swept))
    return cells


def split_sweep_overrides(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split command-line overrides into (plain, sweeps): `seed=0,1` or `x=range(3)` are sweeps.

    Without `-m` Hydra rejects sweep syntax; repro.run takes the sweeps out of argv and adds
    them to the grid itself, so `python -m repro.run +exp=X seed=0,1` means what `-m` means.
    """
    plain, sweeps = [], []
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (ov,) = parser.parse_overrides([text])
        except Exception:  # let Hydra report malformed overrides in its own words
            plain.append(text)
            continue
        (sweeps if ov.is_sweep_override() else plain).append(text)
    return plain, sweeps
