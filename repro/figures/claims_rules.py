"""The verdict rules of the claims catalogue (claims_catalogue.yaml names one per claim).

A rule is a builder: RULES[name](artefact, **params) -> evaluate(Results) -> Finding, where
`params` are the claim's entries in the catalogue (systems, metrics, x axis, thresholds). A rule
listed in PAPER_NUMBER also receives the number the paper states, read from the claim's `paper`
text by claims_catalogue (so the number is written once). Generic rules compare systems over
the points of any performance figure; the specific ones encode one figure's claim shape.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np

from repro.figures.claims_evidence import (
    Results,
    common_seeds,
    improvement,
    points,
    row_seeds,
    seed_values,
    value,
    versus,
)
from repro.figures.claims_verdict import (
    FACTOR_BAND,
    HIGHER,
    LOSS,
    NO_DATA,
    NOT,
    REPRODUCED,
    SHORT,
    TIE,
    TPUT_TIE,
    WIN,
    Checks,
    Finding,
    compare,
    num,
    listed,
    numeric,
    paired,
    pct,
    qualitative,
    seedwise,
    times,
    worst,
)
from repro.figures.load import SYSTEM
from repro.figures.style import BASELINES, OURS, PAPER_SYSTEMS


# -- claim builders --------------------------------------------------------------------------
def lowest(name: str, system: str, metrics: Iterable[str], x: str | None = None, against=None, where=None):
    """`system` is better than every other system (or those in `against`) in `metrics` at every point."""

    def run(r: Results) -> Finding:
        agg = r.perf(name, where)
        checks = Checks()
        for label, g in points(agg, x):
            if not (g[SYSTEM] == system).any():
                continue
            others = [s for s in g[SYSTEM] if s != system and s in (against or PAPER_SYSTEMS)]
            for m in metrics:
                res = {s: versus(g, system, s, m) for s in others}
                outcome, n = worst(res.values())
                losers = [s for s, (o, _) in res.items() if o == LOSS]
                tied = [s for s, (o, _) in res.items() if o == TIE]
                text = f"{label} {SHORT[m]}: " + (
                    "; ".join(
                        p
                        for p in (
                            f"{', '.join(losers)} better" if losers else "",
                            f"{', '.join(tied)} tied" if tied else "",
                        )
                        if p
                    )
                )
                checks.add(outcome, n, text)
        return qualitative(checks, "point×metric comparisons")

    return run


def ours_beat_baselines(name: str, metrics: Iterable[str], x: str | None = None, where=None):
    def run(r: Results) -> Finding:
        agg = r.perf(name, where)
        checks = Checks()
        for label, g in points(agg, x):
            present = set(g[SYSTEM])
            for o in (s for s in OURS if s in present):
                for b in (s for s in BASELINES if s in present):
                    for m in metrics:
                        outcome, n = versus(g, o, b, m)
                        what = "tied with" if outcome == TIE else "not better than"
                        checks.add(outcome, n, f"{label} {SHORT[m]}: {o} {what} {b}")
        return qualitative(checks, "(ours, baseline, point, metric) comparisons")

    return run


def best_is_ours(name: str, metrics: Iterable[str], x: str):
    """At every point the best of our methods (by seed mean) beats every baseline (noise-aware)."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        checks = Checks()
        for label, g in points(agg, x):
            g = g[g[SYSTEM].isin(PAPER_SYSTEMS)]  # extra comparison rows (Dynamo, llm-d, ...) are not the paper's
            present = list(g[SYSTEM])
            ours = [s for s in OURS if s in present]
            bases = [s for s in BASELINES if s in present]
            for m in metrics:
                if not ours or not bases:
                    continue
                pick = max if m in HIGHER else min
                best = pick(ours, key=lambda s: value(g, s, m))
                res = {b: versus(g, best, b, m) for b in bases}
                outcome, n = worst(res.values())
                beaten = [b for b, (o, _) in res.items() if o == LOSS]
                tied = [b for b, (o, _) in res.items() if o == TIE]
                text = f"{label} {SHORT[m]}: best of ours {best}" + (
                    f" behind {', '.join(beaten)}" if beaten else f" tied with {', '.join(tied)}" if tied else ""
                )
                checks.add(outcome, n, text)
        return qualitative(checks, "settings×metrics")

    return run


def _facet_stat(r_groups, fn) -> Callable[[int], float | None]:
    """stat(seed): mean over facets of fn(g, seed) (None if a facet lacks the seed)."""

    def stat(seed: int):
        vals = []
        for g in r_groups:
            v = fn(g, seed)
            if v is None:
                return None
            vals.append(v)
        return float(np.mean(vals)) if vals else None

    return stat


def _at(g, system, metric, seed):
    v = seed_values(g, system, metric)
    return v.get(seed)


def mean_ratio(name: str, base: str, ours: str, metric: str, paper: float, fmt=times, where=None):
    """Mean over facets of improvement(base -> ours)."""

    def run(r: Results) -> Finding:
        agg = r.perf(name, where)
        vals, per, groups = [], [], []
        for label, g in points(agg):
            present = set(g[SYSTEM])
            if base in present and ours in present:
                v = improvement(metric, value(g, base, metric), value(g, ours, metric))
                vals.append(v)
                per.append(f"{label} {fmt(v)}")
                groups.append(g)
        if not vals:
            return Finding(f"needs {base} and {ours}", NO_DATA)

        def one(g, seed):
            b, o = _at(g, base, metric, seed), _at(g, ours, metric, seed)
            return None if b is None or o is None else improvement(metric, b, o)

        seeds = set.intersection(*(common_seeds(g, (base, ours), metric) for g in groups))
        neutral = 1.0 if fmt is times else 0.0
        stat = _facet_stat(groups, one)
        direction = seedwise(stat, sorted(seeds), neutral, 1.0 if fmt is times else np.sign(paper))
        per_seed = [stat(s) for s in sorted(seeds)]
        return numeric(float(np.mean(vals)), paper, fmt, per if len(per) > 1 else None, direction, per_seed)

    return run


def reduction(name: str, base: str, ours: str, metric: str, paper: float):
    """1 − ours / base (paper: −x % written as the positive reduction x / 100), mean over facets."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        vals, groups = [], []
        for _, g in points(agg):
            if {base, ours} <= set(g[SYSTEM]):
                vals.append(1 - value(g, ours, metric) / value(g, base, metric))
                groups.append(g)
        if not vals:
            return Finding(f"needs {base} and {ours}", NO_DATA)

        def one(g, seed):
            b, o = _at(g, base, metric, seed), _at(g, ours, metric, seed)
            return None if b is None or o is None else 1 - o / b

        seeds = set.intersection(*(common_seeds(g, (base, ours), metric) for g in groups))
        stat = _facet_stat(groups, one)
        direction = seedwise(stat, sorted(seeds), 0.0, np.sign(paper))
        per_seed = [stat(s) for s in sorted(seeds)]
        return numeric(float(np.mean(vals)), paper, lambda z: pct(-z), direction=direction, per_seed=per_seed)

    return run


def vs_best_baseline(name: str, system: str, metric: str, paper: float, where=None):
    def run(r: Results) -> Finding:
        agg = r.perf(name, where)
        vals, per, pairs = [], [], []
        for label, g in points(agg):
            base = [s for s in BASELINES if s in set(g[SYSTEM])]
            if not base or system not in set(g[SYSTEM]):
                continue
            best = min(base, key=lambda s: value(g, s, metric))
            v = 1 - value(g, system, metric) / value(g, best, metric)
            vals.append(v)
            per.append(f"{label} {pct(-v)} vs {best}")
            pairs.append((g, best))
        if not vals:
            return Finding("needs LBGR+RLT and a baseline", NO_DATA)

        def stat(seed):
            out = []
            for g, best in pairs:
                b, o = _at(g, best, metric, seed), _at(g, system, metric, seed)
                if b is None or o is None:
                    return None
                out.append(1 - o / b)
            return float(np.mean(out))

        seeds = set.intersection(*(common_seeds(g, (system, b), metric) for g, b in pairs))
        direction = seedwise(stat, sorted(seeds), 0.0, np.sign(paper))
        return numeric(float(np.mean(vals)), paper, lambda z: pct(-z), per, direction)

    return run


def added_overhead(name: str, column: str, base: str, ours: str, paper_ms: float):
    def run(r: Results) -> Finding:
        g = r.perf(name)
        if not {base, ours} <= set(g[SYSTEM]):
            return Finding(f"needs {base} and {ours}", NO_DATA)
        add = value(g, ours, column) - value(g, base, column)
        if not math.isfinite(add):
            return Finding("not measured", NO_DATA)
        verdict = REPRODUCED if add <= FACTOR_BAND * paper_ms else NOT
        return Finding(f"{'+' if add >= 0 else '−'}{num(abs(add))} ms", verdict)

    return run


# -- rules of one figure's claim -------------------------------------------------------------
def overhead_negligible(name: str, base: str, ours: str, max_share: float):
    """`ours`' added eviction + routing time over `base` is under max_share of its P50 latency."""

    def run(r: Results) -> Finding:
        g = r.perf(name)
        if not {base, ours} <= set(g[SYSTEM]):
            return Finding(f"needs {base} and {ours}", NO_DATA)
        cols = ("eviction_ms_per_query", "routing_ms_per_query")
        add = sum(value(g, ours, c) - value(g, base, c) for c in cols)
        lat_ms = value(g, ours, "latency_p50_s") * 1e3
        share = add / lat_ms
        return Finding(
            f"+{num(add)} ms = {num(share * 100)} % of {ours}'s P50 latency", REPRODUCED if share < max_share else NOT
        )

    return run


def throughput_converges(name: str, min_workers: int, max_spread: float):
    """At every worker count ≥ min_workers all systems' throughputs are within max_spread."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        checks = []
        for label, g in points(agg, "cluster.num_workers"):
            w = float(g["cluster.num_workers"].iloc[0])
            if w < min_workers:
                continue
            t = g["throughput_rps"].to_numpy(dtype=float)
            spread = (t.max() - t.min()) / t.max()
            checks.append((spread <= max_spread, f"{label} workers: spread {num(spread * 100)} %"))
        return qualitative(
            checks, f"worker counts ≥ {min_workers:g} with all systems within {max_spread * 100:g} % of each other"
        )

    return run


def throughput_higher_small(name: str, system: str, max_workers: int):
    """At every worker count ≤ max_workers `system`'s throughput is above the tie band (and the
    noise) of the best baseline's."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        checks = Checks()
        for label, g in points(agg, "cluster.num_workers"):
            if float(g["cluster.num_workers"].iloc[0]) > max_workers or system not in set(g[SYSTEM]):
                continue
            m = "throughput_rps"
            mine = value(g, system, m)
            best = max((s for s in BASELINES if s in set(g[SYSTEM])), key=lambda s: value(g, s, m))
            base = value(g, best, m)
            if mine > base * (1 + TPUT_TIE):  # above the tie band: is it above the noise too?
                a, b = seed_values(g, system, m), seed_values(g, best, m)
                common = sorted(set(a) & set(b))
                outcome = paired(np.array([a[s] - b[s] for s in common])) if common else WIN
                n = max(len(common), 1)
            else:
                outcome, n = LOSS, 1
            checks.add(outcome, n, f"{label} workers: {num(mine)} vs best baseline {num(base)} req/s")
        return qualitative(
            checks,
            f"worker counts ≤ {max_workers:g} where {system}'s throughput is > 0.5 % (and 2 SE) above every baseline",
        )

    return run


def gap_widens(name: str, system: str, x: str, metric: str):
    """best baseline / `system` in `metric` grows from the smallest to the largest x (per benchmark)."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        m = metric
        checks = Checks()
        for label, g in points(agg):
            gaps = []
            for xv, gx in g.groupby(x, sort=True):
                base = [s for s in BASELINES if s in set(gx[SYSTEM])]
                if not base or system not in set(gx[SYSTEM]):
                    continue
                best = min(base, key=lambda s: value(gx, s, m))
                b, o = seed_values(gx, best, m), seed_values(gx, system, m)
                per_seed = {k: b[k] / o[k] for k in set(b) & set(o)}
                gaps.append((float(xv), value(gx, best, m) / value(gx, system, m), per_seed))
            if len(gaps) >= 2:
                (x0, g0, s0), (x1, g1, s1) = gaps[0], gaps[-1]
                common = sorted(set(s0) & set(s1))
                d = np.array([s1[k] - s0[k] for k in common]) if common else np.array([g1 - g0])
                checks.add(
                    paired(d),
                    max(len(common), 1),
                    f"{label}: best baseline / {system} {SHORT[m]} {times(g0)} at {x0:g} → {times(g1)} at {x1:g}",
                )
        if not len(checks):
            return Finding("needs ≥ 2 memory fractions", NO_DATA)
        return listed(checks, "benchmarks")

    return run


def rlt_beats_lru(name: str, metrics: Iterable[str]):
    """Per workload, the RLT cell beats the L-LRU cell in every metric (single-worker table)."""
    metrics = tuple(metrics)

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        checks = Checks()
        keys = [c for c in ("workload.name",) if c in agg]
        groups = agg.groupby(keys, sort=False) if keys else [("all", agg)]
        for label, g in groups:
            label = label[0] if isinstance(label, tuple) else label
            ev = dict(zip(g["eviction.name"], range(len(g))))
            if not {"lru", "rlt"} <= set(ev):
                continue
            lru, rlt = g.iloc[ev["lru"]], g.iloc[ev["rlt"]]
            for m in metrics:
                outcome, n = compare(m, row_seeds(rlt, m), row_seeds(lru, m), rlt[m], lru[m])
                checks.add(outcome, n, f"{label} {SHORT[m]}: RLT {num(rlt[m])} vs L-LRU {num(lru[m])}")
        return qualitative(checks, f"workload×metric comparisons ({', '.join(SHORT[m] for m in metrics)})")

    return run


def timely_decay(name: str, metric: str):
    """Every LBGR system is better in `metric` at the shortest decay interval than at the longest."""

    def run(r: Results) -> Finding:
        agg = r.perf(name)
        x = "router.decay_interval_s"
        m = metric
        checks = Checks()
        for _label, g in points(agg):
            for s in sorted(set(g[SYSTEM])):
                line = g[(g[SYSTEM] == s) & g[x].notna()].sort_values(x)
                if len(line) < 2:
                    continue
                lo, hi = line.iloc[0], line.iloc[-1]
                outcome, n = compare(m, row_seeds(lo, m), row_seeds(hi, m), lo[m], hi[m])
                checks.add(
                    outcome, n, f"{s}: {SHORT[m]} {num(lo[m])} s at Δt={lo[x]:g} s vs {num(hi[m])} s at Δt={hi[x]:g} s"
                )
        if not len(checks):
            return Finding("needs ≥ 2 decay intervals", NO_DATA)
        return listed(checks, "LBGR systems")

    return run


def theory(name: str, policy: str):
    """L-LRU = x (the lower bound, within 1 %), RLT within FACTOR_BAND of H_x, OPT = 1 (within 1 %)."""

    def run(r: Results) -> Finding:
        df = r.theory()
        d = df[(df["policy"] == policy) & df["construction"].isin(["thm4", "thm5"])]
        if d.empty:
            return Finding(f"no {policy} cells", NO_DATA)
        checks, ratios = [], []
        for _, row in d.sort_values(["construction", "x"]).iterrows():
            x, m = float(row["x"]), float(row["misses_per_phase"])
            ref = {"lru": x, "rlt": float(row["harmonic"]), "opt": 1.0}[policy]
            ratio = m / ref
            ratios.append(ratio)
            ok = (1 / FACTOR_BAND <= ratio <= FACTOR_BAND) if policy == "rlt" else abs(ratio - 1) <= 0.01
            checks.append((ok, f"{row['construction']} x={x:g}: {num(m)} vs {num(ref)}"))
        f = qualitative(checks, "sizes")
        what = {"lru": "misses / (B − L + 1)", "rlt": "misses / H", "opt": "misses"}[policy]
        span = f"{what} from {min(ratios):.3f} to {max(ratios):.3f} over x = {d['x'].min():g}..{d['x'].max():g}"
        return Finding(f"{f.ours}; {span}", f.verdict)

    return run


RULES: dict[str, Callable] = {
    f.__name__: f
    for f in (
        lowest,
        ours_beat_baselines,
        best_is_ours,
        mean_ratio,
        reduction,
        vs_best_baseline,
        added_overhead,
        overhead_negligible,
        throughput_converges,
        throughput_higher_small,
        gap_widens,
        rlt_beats_lru,
        timely_decay,
        theory,
    )
}
# Rules that take the paper's number, and the form of the `paper` text they accept: "ratio_or_change"
# (11.96× or +36.45 %: paper=the factor or the signed fraction, fmt=times or pct), "reduction"
# (−38 %: paper=0.38), "ms" (+0.58 ms: paper_ms=0.58).
PAPER_NUMBER = {
    "mean_ratio": "ratio_or_change",
    "reduction": "reduction",
    "vs_best_baseline": "reduction",
    "added_overhead": "ms",
}
# Systems a rule parameter may name as a group instead of one by one.
GROUPS = {"baselines": BASELINES, "ours": OURS, "paper": PAPER_SYSTEMS}
