"""The numbers the claims are judged on: lazy, cached access to the tables the figures draw
(the same loader and checks), with per-seed values attached, and lookups over their points.

`Results` is what every verdict rule (claims_rules) receives; nothing here decides a verdict
except `versus`, the paired comparison of two systems at one point (claims_verdict.compare).
Inside `compared_regimes()` the lookups (`value`, `seed_values`, `row_seeds`: every comparison
goes through them) also note the load regime of each (system, point) row they read, so that the
claims table can say which regime its numbers come from (`regime_text`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from repro.figures.claims_verdict import HIGHER, LOWER, compare
from repro.figures.load import REGIME, SYSTEM, ResultsError
from repro.figures.style import system_order
from repro.metrics import REGIMES

# row key -> (system, regime) of the rows read while a claim is evaluated; None outside
_COMPARED: ContextVar[dict | None] = ContextVar("compared_rows", default=None)

PER_SEED = "_per_seed"  # column of aggregated tables: {metric: {seed: value}} of the point's cells
# What a claim whose results are missing or unusable raises (its row then says "no data").
NO_DATA_ERRORS = (ResultsError, ValueError, KeyError, ImportError, FileNotFoundError)


class Results:
    """Lazy, cached access to the tables the figures draw (same loader, same checks)."""

    def __init__(self, results_dir: str | Path):
        self.results_dir = Path(results_dir)
        self._cache: dict[str, object] = {}
        self.stamp_cache: dict[str, str] = {}

    def _get(self, key: str, make):
        if key not in self._cache:
            try:
                self._cache[key] = make()
            except NO_DATA_ERRORS as exc:
                self._cache[key] = exc
        v = self._cache[key]
        if isinstance(v, Exception):
            raise v
        return v

    def perf(self, name: str, where: dict | None = None) -> pd.DataFrame:
        """Aggregated points of a performance figure (or table) module, optionally only the
        rows whose columns equal `where` (e.g. Fig. 3's claims are about ShareGPT)."""
        agg = self._perf(name)
        for col, val in (where or {}).items():
            if col in agg:
                agg = agg[agg[col] == val]
        if agg.empty:
            raise ResultsError(f"results/{name}/ has no points with {where}")
        return agg

    def _perf(self, name: str) -> pd.DataFrame:
        from repro.figures import artefact

        def make():
            mod = artefact(name)
            if hasattr(mod, "FIGURE"):
                df, agg = mod.FIGURE.table(self.results_dir)
                keys = mod.FIGURE.point_keys(df)
            else:
                df, agg, keys = mod.table(self.results_dir)
            return with_seeds(df, agg, keys)

        return self._get(name, make)

    def theory(self) -> pd.DataFrame:
        from repro.figures import artefact

        def make():
            df = artefact("thm_competitive_ratio").load(self.results_dir)
            if df.empty:
                raise ResultsError("no finished cells under results/thm_competitive_ratio/")
            return df

        return self._get("thm_competitive_ratio", make)


def with_seeds(df: pd.DataFrame, agg: pd.DataFrame, keys) -> pd.DataFrame:
    """agg plus, per point, the per-seed values of every metric (for the noise-aware comparisons)."""
    from repro.figures.load import SEED, _key

    metrics = [c for c in LOWER + HIGHER if c in df]
    dk = {k: df[k].map(_key).to_numpy() for k in keys}
    seeds = df[SEED].to_numpy() if SEED in df else np.zeros(len(df), dtype=int)
    per = []
    for i in range(len(agg)):
        mask = np.ones(len(df), dtype=bool)
        for k in keys:
            mask &= dk[k] == _key(agg[k].iloc[i])
        rows = np.flatnonzero(mask)
        per.append({m: {int(seeds[j]): float(df[m].iloc[j]) for j in rows} for m in metrics})
    agg = agg.copy()
    agg[PER_SEED] = per
    return agg


def seed_values(g: pd.DataFrame, system: str, metric: str) -> dict[int, float]:
    """{seed: metric} of one system at one point (from with_seeds; {} when not attached)."""
    i = np.flatnonzero(g[SYSTEM].to_numpy() == system)
    if not len(i):
        raise KeyError(f"no {system} cells")
    return row_seeds(g.iloc[i[0]], metric)


def row_seeds(row: pd.Series, metric: str) -> dict[int, float]:
    """{seed: metric} of one aggregated row (from with_seeds; {} when not attached)."""
    seen = _COMPARED.get()
    if seen is not None:
        _note(seen, row.get(PER_SEED), row.name, row.get(SYSTEM), row.get(REGIME))
    return dict(row[PER_SEED].get(metric, {})) if PER_SEED in row else {}


def _note(seen: dict, per_seed, index, system, regime) -> None:
    # a row's per-seed dict lives as long as its cached table: its identity names the row
    seen[id(per_seed) if per_seed is not None else (index, system)] = (str(system or ""), regime)


@contextmanager
def compared_regimes() -> Iterator[dict]:
    """Collect {row: (system, regime)} of the point rows read inside (for regime_text)."""
    seen: dict = {}
    token = _COMPARED.set(seen)
    try:
        yield seen
    finally:
        _COMPARED.reset(token)


def regime_text(seen: dict) -> str:
    """The load regime of the compared rows: "stable", or the systems per non-stable regime
    ("backlogged (CacheAware+LRU)"), after "k of n compared points stable" when some are;
    "n/a" when no row has a regime (theory cells, cells from before the field)."""
    by: dict[str, list[str]] = {}
    for system, regime in seen.values():
        if regime in REGIMES:
            by.setdefault(regime, []).append(system)
    if not by:
        return "n/a"
    if set(by) == {"stable"}:
        return "stable"
    parts = []
    for r in reversed(REGIMES):
        if r in by and r != "stable":
            names = system_order(s for s in by[r] if s)  # rows of tables without systems have no name
            parts.append(f"{r} ({', '.join(names)})" if names else r)
    head = f"{len(by['stable'])} of {len(seen)} compared points stable; " if "stable" in by else ""
    return head + "; ".join(parts)


def versus(g: pd.DataFrame, a: str, b: str, metric: str) -> tuple[int, int]:
    """compare() of two systems at one point g."""
    return compare(
        metric, seed_values(g, a, metric), seed_values(g, b, metric), value(g, a, metric), value(g, b, metric)
    )


# -- helpers over aggregated tables ----------------------------------------------------------
def facet_cols(agg: pd.DataFrame, candidates=("workload.name", "model.name", "workload.order")) -> list[str]:
    return [c for c in candidates if c in agg.columns]


def points(agg: pd.DataFrame, x: str | None = None) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows of all systems at that point) for every facet (x) combination."""
    keys = facet_cols(agg) + ([x] if x else [])
    if not keys:
        return [("all", agg)]
    out = []
    for k, g in agg.groupby(keys, sort=False, dropna=False):
        k = k if isinstance(k, tuple) else (k,)
        out.append(("/".join(_label(v) for v in k), g))
    return out


def _label(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def value(g: pd.DataFrame, system: str, metric: str) -> float:
    """The (seed-mean) metric of one system at one point (numpy lookups: called a lot)."""
    i = np.flatnonzero(g[SYSTEM].to_numpy() == system)
    if not len(i):
        raise KeyError(f"no {system} cells")
    seen = _COMPARED.get()
    if seen is not None:
        per_seed = g[PER_SEED].to_numpy()[i[0]] if PER_SEED in g else None
        _note(seen, per_seed, g.index[i[0]], system, g[REGIME].to_numpy()[i[0]] if REGIME in g else None)
    return float(g[metric].to_numpy()[i[0]])


def improvement(metric: str, base: float, ours: float) -> float:
    """× factor for lower-is-better metrics (base / ours); relative change for higher-is-better."""
    if metric in LOWER:
        return base / ours if ours > 0 else math.inf
    return ours / base - 1 if base > 0 else math.inf


def common_seeds(g: pd.DataFrame, systems: Iterable[str], metric: str) -> set[int]:
    out = None
    for s in systems:
        k = set(seed_values(g, s, metric))
        out = k if out is None else out & k
    return out or set()
