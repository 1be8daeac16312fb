"""The paper's §5 claims, evaluated on our results: a generated table, never written by hand.

Every claim has an id, the artefact it is about, the paper's statement and number, and a
function that computes our number and a verdict from results/ (through the same tables the
figures draw). Only the "why" column is prose, from claims_why.yaml keyed by claim id and
verdict, each text stamped with the results it was written for: an explanation written for
another verdict, or for other numbers, than today's is not shown as current.

Definitions (stated in REPRODUCE.md too):
- "On average" = the arithmetic mean over benchmarks (or models) of the per-benchmark ratio,
  each ratio taken between seed-averaged metrics — our reading of the paper's averages.
- A× improvement in a lower-is-better metric = baseline / ours; "+x % higher hit rate /
  throughput" = relative change ours / baseline − 1 (not percentage points); "−x %" latency =
  1 − ours / baseline.
- Verdicts. Qualitative claims: "reproduced" if they hold in every comparison, "partly" if in
  at least half, else "not reproduced". Numeric claims: "reproduced" if ours points the same
  way and is within a factor 2 of the paper's number (ratios: our improvement factor; percent:
  our change), "partly" if it only points the same way, else "not reproduced". Overheads
  ("RLT adds only 0.58 ms"): "reproduced" if our added overhead is at most twice the paper's.
- Only the paper's six systems take part in comparisons (extra rows such as Dynamo or llm-d are
  drawn but not judged).
- Comparisons know the seed noise. Two systems at one point are compared on the seeds both
  ran: d_s = (a_s − b_s) per seed, signed so that d > 0 means "a is better". With n ≥ 2 seeds,
  a is better (a WIN) only if mean(d) > K_SE (2) standard errors of d (SD(d) / √n, a paired
  comparison: the seeds' shared workload draws cancel), worse (a LOSS) if mean(d) < −2 SE,
  otherwise a TIE. (2 SE is a rough two-sided 95 % band for many seeds; with 3 seeds it is a
  paired t-test at about 82 %.) With one seed there is no noise estimate: the comparison is
  strict (any difference decides), and the Ours column counts how many comparisons rest on
  one seed. Throughput within TPUT_TIE (0.5 %) counts as "not worse" (a WIN for "highest" /
  "not worse"), because every system that keeps up runs at the offered load and differs only
  by the makespan's tail.
- Qualitative verdicts from W wins, T ties, L losses of N comparisons: "reproduced" if W = N,
  "not reproduced" if W = 0 or W < L, else "partly" (without ties: the old "holds in at
  least half"). Numeric claims: the per-seed value of
  the claim's statistic (e.g. the mean over benchmarks of the per-benchmark ratio, per seed)
  must differ from "no change" (1× / 0 %) by more than 2 SE over seeds, else the claim is a
  tie and "not reproduced" (the Ours column says "tie within noise").
- The Why column is prose written for given numbers: each text carries a stamp (a digest of
  the results of the artefacts it is about, repro/figures/claims_why.yaml); a text whose stamp
  differs from today's results is not shown as current but flagged "stale".
  `python -m repro.figures.claims --stale` lists the texts to rewrite, `--stamp ID ...` stamps
  rewritten ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from repro.figures.load import ResultsError
from repro.figures.style import BASELINES, OURS, PAPER_SYSTEMS

REPRODUCED, PARTLY, NOT, NO_DATA = "reproduced", "partly", "not reproduced", "no data"
WIN, TIE, LOSS = 1, 0, -1
K_SE = 2.0  # a difference counts when it exceeds this many standard errors over seeds
VERDICTS = (REPRODUCED, PARTLY, NOT, NO_DATA)
FACTOR_BAND = 2.0  # numeric claims: within a factor 2 of the paper counts as reproduced
TPUT_TIE = 0.005
LOWER = ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s")
HIGHER = ("hit_rate", "throughput_rps")
SHORT = {"latency_p50_s": "P50 latency", "latency_p95_s": "P95 latency", "ttft_p50_s": "P50 TTFT",
         "ttft_p95_s": "P95 TTFT", "hit_rate": "hit rate", "throughput_rps": "throughput"}
SYSTEM = "policy_name"


@dataclass(frozen=True)
class Finding:
    ours: str
    verdict: str


@dataclass(frozen=True)
class Claim:
    id: str
    artefact: str
    statement: str
    paper: str
    evaluate: Callable[["Results"], Finding]


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
            except (ResultsError, ValueError, KeyError, ImportError, FileNotFoundError) as exc:
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


PER_SEED = "_per_seed"  # column of aggregated tables: {metric: {seed: value}} of the point's cells


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
    if PER_SEED not in g:
        return {}
    return dict(g[PER_SEED].iloc[i[0]].get(metric, {}))


def paired(d: np.ndarray) -> int:
    """WIN / TIE / LOSS of per-seed differences d (d > 0: better): beyond K_SE standard errors
    over seeds; with one value, its sign (strict)."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    if not len(d):
        return TIE
    mean = float(d.mean())
    if len(d) >= 2:
        se = float(d.std(ddof=1)) / math.sqrt(len(d))
        if abs(mean) <= K_SE * se:
            return TIE
    if abs(mean) < 1e-12:
        return TIE
    return WIN if mean > 0 else LOSS


def compare(metric: str, a: dict[int, float], b: dict[int, float], a_mean: float, b_mean: float) -> tuple[int, int]:
    """(WIN / TIE / LOSS of a against b in `metric`, seeds compared). Uses the seeds both have;
    without per-seed values the seed means (one observation: strict)."""
    seeds = sorted(set(a) & set(b))
    if metric == "throughput_rps" and a_mean >= b_mean * (1 - TPUT_TIE):
        return WIN, max(len(seeds), 1)  # not worse within TPUT_TIE (see the module docstring)
    sign = 1.0 if metric in HIGHER else -1.0
    if seeds:
        d = np.array([sign * (a[s] - b[s]) for s in seeds])
    else:
        d = np.array([sign * (a_mean - b_mean)])
    return paired(d), max(len(seeds), 1)


def versus(g: pd.DataFrame, a: str, b: str, metric: str) -> tuple[int, int]:
    """compare() of two systems at one point g."""
    return compare(metric, seed_values(g, a, metric), seed_values(g, b, metric), value(g, a, metric), value(g, b, metric))


class Checks:
    """The comparisons of one qualitative claim: (outcome, seeds, description)."""

    def __init__(self):
        self.items: list[tuple[int, int, str]] = []

    def add(self, outcome: int, seeds: int, text: str) -> None:
        self.items.append((outcome, seeds, text))

    def __len__(self):
        return len(self.items)


def worst(outcomes: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """The worst outcome (LOSS < TIE < WIN) and the fewest seeds among comparisons."""
    outcomes = list(outcomes)
    if not outcomes:
        return WIN, 1
    return min(o for o, _ in outcomes), min(n for _, n in outcomes)


# -- formatting ------------------------------------------------------------------------------
def num(v: float) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    a = abs(v)
    if a < 1e-9:  # float noise around an exact tie
        return "0"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def times(v: float) -> str:
    return f"{num(v)}×"


def pct(v: float) -> str:
    return f"{'+' if v >= 0 else '−'}{num(abs(v) * 100)} %"


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
    return float(g[metric].to_numpy()[i[0]])


def improvement(metric: str, base: float, ours: float) -> float:
    """× factor for lower-is-better metrics (base / ours); relative change for higher-is-better."""
    if metric in LOWER:
        return base / ours if ours > 0 else math.inf
    return ours / base - 1 if base > 0 else math.inf


def qualitative(checks, unit: str) -> Finding:
    """Verdict from W wins, T ties, L losses (module docstring). `checks`: a Checks, or a list
    of (bool, description) pairs (strict comparisons: True = WIN, False = LOSS)."""
    items = checks.items if isinstance(checks, Checks) else [(WIN if ok else LOSS, 1, d) for ok, d in checks]
    if not items:
        return Finding("no comparisons", NO_DATA)
    n = len(items)
    wins = sum(o == WIN for o, _, _ in items)
    ties = [d for o, _, d in items if o == TIE]
    fails = [d for o, _, d in items if o == LOSS]
    text = f"holds in {wins}/{n} {unit}"
    if ties:
        text += f"; {len(ties)} tie{'s' if len(ties) > 1 else ''} within noise: " + "; ".join(ties[:2]) + \
            (f" (+{len(ties) - 2} more)" if len(ties) > 2 else "")
    if fails:
        text += "; fails: " + "; ".join(fails[:2]) + (f" (+{len(fails) - 2} more)" if len(fails) > 2 else "")
    single = sum(k < 2 for _, k, _ in items)
    if isinstance(checks, Checks) and single:
        text += f" [{single}/{n} on one seed: strict]"
    if wins == n:
        verdict = REPRODUCED
    elif wins == 0 or wins < len(fails):
        verdict = NOT
    else:
        verdict = PARTLY
    return Finding(text, verdict)


def numeric(ours: float, paper: float, fmt: Callable[[float], str], per: list[str] | None = None,
            direction: int | None = None) -> Finding:
    """Same direction as the paper (sign of the change, or factor > 1) and within FACTOR_BAND.
    `direction`: the noise-aware outcome of "ours differs from no change in the paper's
    direction" (WIN / TIE / LOSS; None: not known, strict)."""
    if ours is None or not math.isfinite(ours):
        return Finding("n/a", NO_DATA)
    same = ours > 1 if fmt is times else (np.sign(ours) == np.sign(paper) and ours != 0)
    close = bool(same) and 1 / FACTOR_BAND <= ours / paper <= FACTOR_BAND
    text = fmt(ours) + (f" ({', '.join(per)})" if per else "")
    if direction == TIE:
        return Finding(text + "; tie within noise", NOT)
    return Finding(text, REPRODUCED if close else (PARTLY if same else NOT))


def seedwise(stat: Callable[[int], float | None], seeds: Iterable[int], neutral: float, paper_sign: float) -> int | None:
    """Outcome of the per-seed values stat(seed) against `neutral` in the paper's direction
    (None when fewer than two seeds give a value: no noise estimate)."""
    vals = [v for v in (stat(s) for s in seeds) if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return None
    return paired(paper_sign * (np.array(vals) - neutral))


def common_seeds(g: pd.DataFrame, systems: Iterable[str], metric: str) -> set[int]:
    out = None
    for s in systems:
        k = set(seed_values(g, s, metric))
        out = k if out is None else out & k
    return out or set()


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
                text = f"{label} {SHORT[m]}: " + ("; ".join(
                    p for p in (f"{', '.join(losers)} better" if losers else "",
                                f"{', '.join(tied)} tied" if tied else "") if p))
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
                    f" behind {', '.join(beaten)}" if beaten else f" tied with {', '.join(tied)}" if tied else "")
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
        direction = seedwise(_facet_stat(groups, one), sorted(seeds), neutral, 1.0 if fmt is times else np.sign(paper))
        return numeric(float(np.mean(vals)), paper, fmt, per if len(per) > 1 else None, direction)
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
        direction = seedwise(_facet_stat(groups, one), sorted(seeds), 0.0, np.sign(paper))
        return numeric(float(np.mean(vals)), paper, lambda z: pct(-z), direction=direction)
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


def overhead_negligible(r: Results) -> Finding:
    g = r.perf("tab2_ablation")
    if not {"CacheAware+LRU", "LBGR+RLT"} <= set(g[SYSTEM]):
        return Finding("needs CacheAware+LRU and LBGR+RLT", NO_DATA)
    cols = ("eviction_ms_per_query", "routing_ms_per_query")
    add = sum(value(g, "LBGR+RLT", c) - value(g, "CacheAware+LRU", c) for c in cols)
    lat_ms = value(g, "LBGR+RLT", "latency_p50_s") * 1e3
    share = add / lat_ms
    return Finding(f"+{num(add)} ms = {num(share * 100)} % of LBGR+RLT's P50 latency",
                   REPRODUCED if share < 0.05 else NOT)


def throughput_converges(r: Results) -> Finding:
    agg = r.perf("fig6_workers")
    checks = []
    for label, g in points(agg, "cluster.num_workers"):
        w = float(g["cluster.num_workers"].iloc[0])
        if w < 6:
            continue
        t = g["throughput_rps"].to_numpy(dtype=float)
        spread = (t.max() - t.min()) / t.max()
        checks.append((spread <= 0.02, f"{label} workers: spread {num(spread * 100)} %"))
    return qualitative(checks, "worker counts ≥ 6 with all systems within 2 % of each other")


def throughput_higher_small(r: Results) -> Finding:
    agg = r.perf("fig6_workers")
    checks = Checks()
    for label, g in points(agg, "cluster.num_workers"):
        if float(g["cluster.num_workers"].iloc[0]) > 4 or "LBGR+RLT" not in set(g[SYSTEM]):
            continue
        m = "throughput_rps"
        mine = value(g, "LBGR+RLT", m)
        best = max((s for s in BASELINES if s in set(g[SYSTEM])), key=lambda s: value(g, s, m))
        base = value(g, best, m)
        if mine > base * (1 + TPUT_TIE):  # above the tie band: is it above the noise too?
            a, b = seed_values(g, "LBGR+RLT", m), seed_values(g, best, m)
            common = sorted(set(a) & set(b))
            outcome = paired(np.array([a[s] - b[s] for s in common])) if common else WIN
            n = max(len(common), 1)
        else:
            outcome, n = LOSS, 1
        checks.add(outcome, n, f"{label} workers: {num(mine)} vs best baseline {num(base)} req/s")
    return qualitative(checks, "worker counts ≤ 4 where LBGR+RLT's throughput is > 0.5 % (and 2 SE) above every baseline")


def gap_widens(r: Results) -> Finding:
    agg = r.perf("fig7_cache_size")
    x = "cluster.mem_fraction"
    m = "latency_p50_s"
    checks = Checks()
    for label, g in points(agg):
        gaps = []
        for xv, gx in g.groupby(x, sort=True):
            base = [s for s in BASELINES if s in set(gx[SYSTEM])]
            if not base or "LBGR+RLT" not in set(gx[SYSTEM]):
                continue
            best = min(base, key=lambda s: value(gx, s, m))
            b, o = seed_values(gx, best, m), seed_values(gx, "LBGR+RLT", m)
            per_seed = {k: b[k] / o[k] for k in set(b) & set(o)}
            gaps.append((float(xv), value(gx, best, m) / value(gx, "LBGR+RLT", m), per_seed))
        if len(gaps) >= 2:
            (x0, g0, s0), (x1, g1, s1) = gaps[0], gaps[-1]
            common = sorted(set(s0) & set(s1))
            d = np.array([s1[k] - s0[k] for k in common]) if common else np.array([g1 - g0])
            checks.add(paired(d), max(len(common), 1), f"{label}: best baseline / LBGR+RLT P50 latency {times(g0)} at "
                                                     f"{x0:g} → {times(g1)} at {x1:g}")
    if not len(checks):
        return Finding("needs ≥ 2 memory fractions", NO_DATA)
    f = qualitative(checks, "benchmarks")
    return Finding("; ".join(d for _, _, d in checks.items) + (" (tie within noise)" if any(
        o == TIE for o, _, _ in checks.items) else ""), f.verdict)


def rlt_beats_lru_single(r: Results) -> Finding:
    agg = r.perf("tab3_single_worker")
    checks = Checks()
    keys = [c for c in ("workload.name",) if c in agg]
    groups = agg.groupby(keys, sort=False) if keys else [("all", agg)]
    for label, g in groups:
        label = label[0] if isinstance(label, tuple) else label
        ev = dict(zip(g["eviction.name"], range(len(g))))
        if not {"lru", "rlt"} <= set(ev):
            continue
        lru, rlt = g.iloc[ev["lru"]], g.iloc[ev["rlt"]]
        for m in ("latency_p50_s", "hit_rate"):
            per = lambda row: dict(row[PER_SEED].get(m, {})) if PER_SEED in row else {}  # noqa: E731
            outcome, n = compare(m, per(rlt), per(lru), rlt[m], lru[m])
            checks.add(outcome, n, f"{label} {SHORT[m]}: RLT {num(rlt[m])} vs L-LRU {num(lru[m])}")
    return qualitative(checks, "workload×metric comparisons (P50 latency, hit rate)")


def timely_decay(r: Results) -> Finding:
    agg = r.perf("fig14_decay_interval")
    x = "router.decay_interval_s"
    m = "latency_p50_s"
    checks = Checks()
    for label, g in points(agg):
        for s in sorted(set(g[SYSTEM])):
            line = g[(g[SYSTEM] == s) & g[x].notna()].sort_values(x)
            if len(line) < 2:
                continue
            lo, hi = line.iloc[0], line.iloc[-1]
            per = lambda row: dict(row[PER_SEED].get(m, {})) if PER_SEED in row else {}  # noqa: E731
            outcome, n = compare(m, per(lo), per(hi), lo[m], hi[m])
            checks.add(outcome, n, f"{s}: P50 latency {num(lo[m])} s at Δt={lo[x]:g} s vs {num(hi[m])} s at "
                                   f"Δt={hi[x]:g} s")
    if not len(checks):
        return Finding("needs ≥ 2 decay intervals", NO_DATA)
    f = qualitative(checks, "LBGR systems")
    return Finding("; ".join(d for _, _, d in checks.items) + (" (tie within noise)" if any(
        o == TIE for o, _, _ in checks.items) else ""), f.verdict)


def theory_claim(policy: str):
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
        name = {"lru": "misses / (B − L + 1)", "rlt": "misses / H", "opt": "misses"}[policy]
        span = f"{name} from {min(ratios):.3f} to {max(ratios):.3f} over x = {d['x'].min():g}..{d['x'].max():g}"
        return Finding(f"{f.ours}; {span}", f.verdict)
    return run


ALL6 = LOWER + HIGHER
SHAREGPT = {"workload.name": "sharegpt"}  # Fig. 3's claims are about ShareGPT (other benchmarks: appendix)
P50 = ("latency_p50_s", "ttft_p50_s")
C = Claim
CLAIMS: tuple[Claim, ...] = (
    # Figure 2 — end-to-end performance
    C("fig2.ours_beat_baselines", "fig2_main", "CacheAware+RLT, LBGR+LRU and LBGR+RLT have lower P50 latency and TTFT "
      "than every baseline on every benchmark", "qualitative", ours_beat_baselines("fig2_main", P50)),
    C("fig2.lbgr_rlt_lowest", "fig2_main", "LBGR+RLT has the lowest P50 latency and TTFT on every benchmark",
      "qualitative", lowest("fig2_main", "LBGR+RLT", P50)),
    C("fig2.lbgr_rlt_highest_hit_tput", "fig2_main", "LBGR+RLT has the highest hit rate and throughput on every benchmark",
      "qualitative", lowest("fig2_main", "LBGR+RLT", HIGHER)),
    C("fig2.p50_latency_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, P50 latency (mean of per-benchmark ratios)",
      "11.96×", mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "latency_p50_s", 11.96)),
    C("fig2.p50_ttft_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, P50 TTFT", "14.06×",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "ttft_p50_s", 14.06)),
    C("fig2.hit_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, hit rate (relative change)", "+36.45 %",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "hit_rate", 0.3645, pct)),
    C("fig2.tput_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, throughput", "+36.51 %",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "throughput_rps", 0.3651, pct)),
    C("fig2.p95_latency_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, P95 latency", "2.03×",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "latency_p95_s", 2.03)),
    C("fig2.p95_ttft_vs_ca", "fig2_main", "LBGR+RLT vs CacheAware+LRU, P95 TTFT", "2.62×",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+RLT", "ttft_p95_s", 2.62)),
    C("fig2.p50_latency_vs_random", "fig2_main", "LBGR+RLT vs Random+LRU, P50 latency", "30.9×",
      mean_ratio("fig2_main", "Random+LRU", "LBGR+RLT", "latency_p50_s", 30.9)),
    C("fig2.p50_ttft_vs_random", "fig2_main", "LBGR+RLT vs Random+LRU, P50 TTFT", "44.49×",
      mean_ratio("fig2_main", "Random+LRU", "LBGR+RLT", "ttft_p50_s", 44.49)),
    C("fig2.ca_rlt_latency", "fig2_main", "CacheAware+RLT vs CacheAware+LRU, P50 latency", "6.98×",
      mean_ratio("fig2_main", "CacheAware+LRU", "CacheAware+RLT", "latency_p50_s", 6.98)),
    C("fig2.ca_rlt_ttft", "fig2_main", "CacheAware+RLT vs CacheAware+LRU, P50 TTFT", "6.40×",
      mean_ratio("fig2_main", "CacheAware+LRU", "CacheAware+RLT", "ttft_p50_s", 6.40)),
    C("fig2.lbgr_lru_latency", "fig2_main", "LBGR+LRU vs CacheAware+LRU, P50 latency", "9.98×",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+LRU", "latency_p50_s", 9.98)),
    C("fig2.lbgr_lru_ttft", "fig2_main", "LBGR+LRU vs CacheAware+LRU, P50 TTFT", "9.58×",
      mean_ratio("fig2_main", "CacheAware+LRU", "LBGR+LRU", "ttft_p50_s", 9.58)),
    # Figure 3 — models
    C("fig3.ours_beat_baselines", "fig3_models", "Our methods beat all baselines on ShareGPT on both models, all six "
      "metrics", "qualitative", ours_beat_baselines("fig3_models", ALL6, where=SHAREGPT)),
    C("fig3.lbgr_rlt_best", "fig3_models", "LBGR+RLT has the lowest P50 latency and TTFT and the highest hit rate and "
      "throughput on both models", "qualitative", lowest("fig3_models", "LBGR+RLT", P50 + HIGHER, where=SHAREGPT)),
    C("fig3.latency_vs_best_baseline", "fig3_models", "LBGR+RLT vs the best baseline, P50 latency on ShareGPT (mean over models)",
      "−38 %", vs_best_baseline("fig3_models", "LBGR+RLT", "latency_p50_s", 0.38, SHAREGPT)),
    C("fig3.ttft_vs_best_baseline", "fig3_models", "LBGR+RLT vs the best baseline, P50 TTFT", "−44.87 %",
      vs_best_baseline("fig3_models", "LBGR+RLT", "ttft_p50_s", 0.4487, SHAREGPT)),
    # Figure 4 — worst-case order
    C("fig4.lbgr_rlt_best", "fig4_order", "LBGR+RLT is best on all six metrics under the round-robin order on LooGLE",
      "qualitative", lowest("fig4_order", "LBGR+RLT", ALL6)),
    C("fig4.latency_vs_ca", "fig4_order", "LBGR+RLT vs CacheAware+LRU, P50 latency", "22.8×",
      mean_ratio("fig4_order", "CacheAware+LRU", "LBGR+RLT", "latency_p50_s", 22.8)),
    C("fig4.ttft_vs_ca", "fig4_order", "LBGR+RLT vs CacheAware+LRU, P50 TTFT", "15.5×",
      mean_ratio("fig4_order", "CacheAware+LRU", "LBGR+RLT", "ttft_p50_s", 15.5)),
    # Figure 5 — request rate
    C("fig5.lbgr_rlt_lowest", "fig5_request_rate", "LBGR+RLT has the lowest P50 and P95 latency and TTFT at every "
      "request rate", "qualitative", lowest("fig5_request_rate", "LBGR+RLT", LOWER, "workload.request_rate")),
    C("fig5.lbgr_rlt_highest", "fig5_request_rate", "LBGR+RLT has the highest hit rate and throughput at every request "
      "rate", "qualitative", lowest("fig5_request_rate", "LBGR+RLT", HIGHER, "workload.request_rate")),
    # Figure 6 — workers
    C("fig6.lbgr_rlt_beats_baselines", "fig6_workers", "LBGR+RLT beats every baseline on all six metrics at every "
      "worker count", "qualitative", lowest("fig6_workers", "LBGR+RLT", ALL6, "cluster.num_workers", BASELINES)),
    C("fig6.tput_higher_small", "fig6_workers", "LBGR+RLT's throughput is higher than the baselines' at 2 and 4 workers",
      "qualitative", throughput_higher_small),
    C("fig6.tput_converges", "fig6_workers", "Throughput of all systems converges at ≥ 6 workers", "qualitative",
      throughput_converges),
    # Figure 7 — cache size
    C("fig7.ours_beat_baselines", "fig7_cache_size", "Our methods beat all baselines on all six metrics at every cache "
      "size", "qualitative", ours_beat_baselines("fig7_cache_size", ALL6, "cluster.mem_fraction")),
    C("fig7.gap_widens", "fig7_cache_size", "The gap to the baselines widens as the cache grows (best baseline / "
      "LBGR+RLT P50 latency, smallest vs largest memory fraction)", "qualitative", gap_widens),
    # Table 2 — ablation and overheads
    C("tab2.ca_rlt_all_metrics", "tab2_ablation", "CacheAware+RLT beats CacheAware+LRU on all six metrics",
      "qualitative", lowest("tab2_ablation", "CacheAware+RLT", ALL6, None, ("CacheAware+LRU",))),
    C("tab2.ca_rlt_latency", "tab2_ablation", "CacheAware+RLT vs CacheAware+LRU, P50 latency", "−28.1 %",
      reduction("tab2_ablation", "CacheAware+LRU", "CacheAware+RLT", "latency_p50_s", 0.281)),
    C("tab2.ca_rlt_ttft", "tab2_ablation", "CacheAware+RLT vs CacheAware+LRU, P50 TTFT", "−42.7 %",
      reduction("tab2_ablation", "CacheAware+LRU", "CacheAware+RLT", "ttft_p50_s", 0.427)),
    C("tab2.lbgr_lru_latency", "tab2_ablation", "LBGR+LRU vs CacheAware+LRU, P50 latency", "−77.4 %",
      reduction("tab2_ablation", "CacheAware+LRU", "LBGR+LRU", "latency_p50_s", 0.774)),
    C("tab2.lbgr_lru_ttft", "tab2_ablation", "LBGR+LRU vs CacheAware+LRU, P50 TTFT", "−88.2 %",
      reduction("tab2_ablation", "CacheAware+LRU", "LBGR+LRU", "ttft_p50_s", 0.882)),
    C("tab2.lbgr_rlt_latency", "tab2_ablation", "LBGR+RLT vs CacheAware+LRU, P50 latency", "11.8×",
      mean_ratio("tab2_ablation", "CacheAware+LRU", "LBGR+RLT", "latency_p50_s", 11.8)),
    C("tab2.lbgr_rlt_ttft", "tab2_ablation", "LBGR+RLT vs CacheAware+LRU, P50 TTFT", "23×",
      mean_ratio("tab2_ablation", "CacheAware+LRU", "LBGR+RLT", "ttft_p50_s", 23.0)),
    C("tab2.evict_overhead_ca", "tab2_ablation", "RLT's added eviction time over LRU with Cache-Aware (per query)",
      "+0.58 ms", added_overhead("tab2_ablation", "eviction_ms_per_query", "CacheAware+LRU", "CacheAware+RLT", 0.58)),
    C("tab2.evict_overhead_lbgr", "tab2_ablation", "RLT's added eviction time over LRU with LBGR", "+0.96 ms",
      added_overhead("tab2_ablation", "eviction_ms_per_query", "LBGR+LRU", "LBGR+RLT", 0.96)),
    C("tab2.route_overhead_lru", "tab2_ablation", "LBGR's added routing time over Cache-Aware with LRU (per query)",
      "+0.56 ms", added_overhead("tab2_ablation", "routing_ms_per_query", "CacheAware+LRU", "LBGR+LRU", 0.56)),
    C("tab2.route_overhead_rlt", "tab2_ablation", "LBGR's added routing time over Cache-Aware with RLT", "+0.94 ms",
      added_overhead("tab2_ablation", "routing_ms_per_query", "CacheAware+RLT", "LBGR+RLT", 0.94)),
    C("tab2.overhead_negligible", "tab2_ablation", "The added overhead of RLT + LBGR (~2 ms per query) is negligible "
      "against end-to-end latency (< 5 % of P50)", "~2 ms", overhead_negligible),
    # Appendix B (reconstructed axes)
    C("fig10.ours_best", "fig10_prefix_ratio", "Our methods are best at every shared-prefix ratio (P50 latency, "
      "P50 TTFT)", "qualitative", best_is_ours("fig10_prefix_ratio", P50, "workload.shared_prefix_ratio")),
    C("fig11.ours_best", "fig11_num_queries", "Our methods are best at every number of queries", "qualitative",
      best_is_ours("fig11_num_queries", P50, "workload.num_queries")),
    C("fig12.ours_best", "fig12_output_len", "Our methods are best at every output length", "qualitative",
      best_is_ours("fig12_output_len", P50, "workload.output_len")),
    C("fig13.ours_best", "fig13_batch_size", "Our methods are best at every maximum batch size", "qualitative",
      best_is_ours("fig13_batch_size", P50, "cluster.scheduler.max_running_requests")),
    C("tab3.rlt_beats_lru", "tab3_single_worker", "On one worker RLT improves on L-LRU (lower P50 latency, higher hit "
      "rate) on every workload", "qualitative", rlt_beats_lru_single),
    C("fig14.timely_decay", "fig14_decay_interval", "Timely queue-load decay matters: LBGR's P50 latency is lower at "
      "the shortest Δt than at the longest", "qualitative", timely_decay),
    # Theorems 4-7 on the replayer
    C("thm.lru_linear", "thm_competitive_ratio", "L-LRU misses B − L + 1 (β: B − L − β + 2) tokens per phase on the "
      "lower-bound constructions (within 1 %)", "Thm 4, 5", theory_claim("lru")),
    C("thm.rlt_harmonic", "thm_competitive_ratio", "RLT's misses per phase grow like the harmonic number H(B − L + 1) "
      "(within a factor 2)", "Thm 6, 7", theory_claim("rlt")),
    C("thm.opt_one", "thm_competitive_ratio", "OPT misses one token per phase on the constructions", "Thm 4 proof",
      theory_claim("opt")),
)

# Hand-written explanations live in claims_why.yaml next to this file (prose is data, not code):
# notes (shared, cited as [key]) and, per claim id and verdict, the text and the STAMP of the
# results it was written against. A stamp is a digest of the artefacts' plotted numbers (every
# point's seed means of the six metrics, 3 significant digits, and its seed list): regenerate
# the results with different numbers and every text written for the old ones is flagged stale.
WHY_FILE = Path(__file__).with_name("claims_why.yaml")
STAMP_DIGITS = 3


@dataclass(frozen=True)
class Why:
    text: str
    stamp: str = ""  # digest of the results of `about` the text was written against ("" = never stamped)
    about: tuple[str, ...] = ()  # artefacts whose numbers it quotes (default: the claim's artefact)


def load_why(path: Path = WHY_FILE) -> tuple[dict[str, Why], dict[str, dict[str, Why]]]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    notes = {k: Why(v["text"], str(v.get("stamp") or ""), tuple(v.get("about") or ())) for k, v in
             (data.get("notes") or {}).items()}
    why_ = {cid: {verdict: Why(e["text"], str(e.get("stamp") or ""), tuple(e.get("about") or ()))
                  for verdict, e in per.items()} for cid, per in (data.get("why") or {}).items()}
    return notes, why_


NOTES, WHY = load_why()


def _note_text(v) -> str:
    return v.text if isinstance(v, Why) else str(v)


def artefact_digest(r: Results, name: str) -> str:
    """Digest of one artefact's plotted numbers ("" when it has no results)."""
    import hashlib

    try:
        agg = r.theory() if name == "thm_competitive_ratio" else r.perf(name)
    except (ResultsError, ValueError, KeyError, ImportError, FileNotFoundError):
        return ""
    drop = {PER_SEED} | {c for c in agg.columns if c.endswith("_sd")}
    cols = sorted(c for c in agg.columns if c not in drop)
    lines = []
    for _, row in agg.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, (float, np.floating)):
                v = "nan" if not math.isfinite(v) else f"{float(v):.{STAMP_DIGITS}g}"
            cells.append(f"{c}={v}")
        lines.append("|".join(cells))
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]


def stamp_of(r: Results, artefacts: Iterable[str]) -> str:
    import hashlib

    parts = [f"{a}:{r.stamp_cache.setdefault(a, artefact_digest(r, a))}" for a in sorted(set(artefacts))]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:10]


def _stale(stamp_now: str, entry: Why) -> bool:
    return entry.stamp != stamp_now


STALE_HINT = "`python -m repro.figures.claims --stale`"


def why(claim_id: str, verdict: str, stamp_now: str | None = None) -> str:
    """The Why cell: the text written for this verdict AND these numbers, else a flag saying so."""
    texts = WHY.get(claim_id, {})
    if verdict in texts:
        entry = texts[verdict]
        if isinstance(entry, str):  # plain text (tests): no stamp to check
            return entry
        if stamp_now is not None and _stale(stamp_now, entry):
            return (f"(stale: the explanation on file was written for other results, stamp {entry.stamp or 'none'} "
                    f"vs {stamp_now} now; list: {STALE_HINT})")
        return entry.text
    if verdict in (REPRODUCED,):
        return ""
    if verdict == NO_DATA:
        return "results missing: run `make figures`"
    if texts:
        return f"(verdict changed; the explanation on file was written for: {', '.join(texts)})"
    return "not analysed yet"


def why_about(claim: Claim, entry) -> tuple[str, ...]:
    return tuple(getattr(entry, "about", ()) or ()) or (claim.artefact,)


def evaluate(results_dir: str | Path) -> pd.DataFrame:
    """One row per claim: id, artefact, claim, paper, ours, verdict, why, stamp (of the numbers
    the claim's Why text must have been written against)."""
    r = Results(results_dir)
    rows = []
    for c in CLAIMS:
        try:
            f = c.evaluate(r)
        except (ResultsError, ValueError, KeyError, ImportError, FileNotFoundError) as exc:
            reason = str(exc).split("\n")[0]
            f = Finding(f"no data ({reason[:160]})", NO_DATA)
        entry = WHY.get(c.id, {}).get(f.verdict)
        stamp = stamp_of(r, why_about(c, entry))
        rows.append({"id": c.id, "artefact": c.artefact, "claim": c.statement, "paper": c.paper,
                     "ours": f.ours, "verdict": f.verdict, "why": why(c.id, f.verdict, stamp), "stamp": stamp})
    table = pd.DataFrame(rows)
    table.attrs["note_stamps"] = {k: stamp_of(r, v.about or ("fig2_main",)) for k, v in NOTES.items()
                                  if isinstance(v, Why)}
    return table


def stale_entries(table: pd.DataFrame) -> list[dict]:
    """Every Why text / note that is not current for these results: what to rewrite."""
    out = []
    for _, row in table.iterrows():
        if row["verdict"] == NO_DATA:
            continue
        texts = WHY.get(row["id"], {})
        entry = texts.get(row["verdict"])
        if entry is None:
            if texts or row["verdict"] != REPRODUCED:
                out.append({"kind": "why", "id": row["id"], "verdict": row["verdict"], "reason":
                            f"no text for this verdict (on file: {', '.join(texts) or 'none'})",
                            "ours": row["ours"], "stamp": row["stamp"]})
        elif isinstance(entry, Why) and _stale(row["stamp"], entry):
            out.append({"kind": "why", "id": row["id"], "verdict": row["verdict"], "reason":
                        f"written for stamp {entry.stamp or 'none'}, results now {row['stamp']}",
                        "ours": row["ours"], "stamp": row["stamp"], "text": entry.text})
    for k, stamp in table.attrs.get("note_stamps", {}).items():
        if NOTES[k].stamp != stamp:
            out.append({"kind": "note", "id": k, "verdict": "", "reason":
                        f"written for stamp {NOTES[k].stamp or 'none'}, results now {stamp}",
                        "ours": "", "stamp": stamp, "text": NOTES[k].text})
    return out


def stamp_entries(table: pd.DataFrame, ids: Iterable[str], path: Path = WHY_FILE) -> list[str]:
    """Record today's stamp on the texts of `ids` (claim ids or note keys) for today's verdicts;
    returns what was stamped. A claim without a text for today's verdict cannot be stamped."""
    import yaml

    data = yaml.safe_load(path.read_text())
    by_id = table.set_index("id")
    done = []
    for i in ids:
        if i in data.get("notes", {}):
            data["notes"][i]["stamp"] = table.attrs["note_stamps"][i]
            done.append(i)
            continue
        if i not in by_id.index:
            raise KeyError(f"unknown claim id or note {i!r}")
        verdict = by_id.loc[i, "verdict"]
        entry = data.get("why", {}).get(i, {}).get(verdict)
        if entry is None:
            raise KeyError(f"{i}: no text for today's verdict {verdict!r} in {path.name}: write it first")
        entry["stamp"] = by_id.loc[i, "stamp"]
        done.append(i)
    write_why(data, path)
    return done


WHY_HEADER = """\
# Hand-written explanations of the claims table (repro/figures/claims.py evaluates everything else).
# notes: shared explanations cited as [key]; why: claim id -> verdict it was written for -> text.
# stamp: digest of the results the text was written against (the artefacts in `about`, default
# the claim's own; notes default to fig2_main). After regenerating results, list what needs
# rewriting with `python -m repro.figures.claims --stale`, rewrite the texts here, then record
# the new numbers with `python -m repro.figures.claims --stamp ID [ID ...]`.
"""


def write_why(data: dict, path: Path = WHY_FILE) -> None:
    import yaml

    from repro.results import atomic_write_text

    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)
    atomic_write_text(path, WHY_HEADER + body)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(table: pd.DataFrame) -> str:
    """The claims table as Markdown (deterministic text; what --check compares)."""
    counts = table["verdict"].value_counts()
    head = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    lines = [
        f"{len(table)} claims: {head}.",
        "",
        "| ID | Claim | Paper | Ours | Verdict | Why |",
        "|:---|:---|:---|:---|:---|:---|",
    ]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(_cell(x) for x in (f"`{row['id']}`", row["claim"], row["paper"], row["ours"],
                                                           f"**{row['verdict']}**", row["why"])) + " |")
    used = cited_notes(" ".join(table["why"]))
    if used:
        lines += ["", "Notes cited in the Why column:", ""]
        stamps = table.attrs.get("note_stamps", {})
        for k in used:
            v = NOTES[k]
            flag = " *(stale: written for other results)*" if isinstance(v, Why) and stamps.get(k, v.stamp) != v.stamp else ""
            lines.append(f"- **[{k}]**{flag} {_note_text(v)}")
    return "\n".join(lines) + "\n"


def cited_notes(text: str) -> list[str]:
    """NOTES keys cited as [key] in text, and in the notes they cite, in NOTES order."""
    found: set[str] = set()
    todo = [text]
    while todo:
        t = todo.pop()
        for k in NOTES:
            if f"[{k}]" in t and k not in found:
                found.add(k)
                todo.append(_note_text(NOTES[k]))
    return [k for k in NOTES if k in found]


def status_by_artefact(table: pd.DataFrame) -> dict[str, str]:
    out = {}
    for art, g in table.groupby("artefact", sort=False):
        counts = g["verdict"].value_counts()
        out[art] = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts.get(v, 0))
    return out


def main(argv=None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m repro.figures.claims",
                                 description="List the claims table's Why texts that need rewriting, or stamp rewritten ones.")
    ap.add_argument("--results-dir", default="results")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--stale", action="store_true", help="list texts written for other verdicts or other numbers (exit 1 if any)")
    g.add_argument("--stamp", nargs="+", metavar="ID", help="record today's numbers on these claim ids / note keys")
    a = ap.parse_args(argv)
    table = evaluate(a.results_dir)
    if a.stamp:
        try:
            done = stamp_entries(table, a.stamp)
        except KeyError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 2
        print(f"stamped {len(done)}: {' '.join(done)}")
        return 0
    todo = stale_entries(table)
    for e in todo:
        print(f"{e['kind']} {e['id']}" + (f" [{e['verdict']}]" if e["verdict"] else "") + f": {e['reason']}")
        if e["ours"]:
            print(f"    ours now: {e['ours']}")
        if e.get("text"):
            print(f"    text on file: {e['text'][:300]}")
    print(f"{len(todo)} text(s) to rewrite" if todo else "every Why text is current")
    return 1 if todo else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CLAIMS", "WHY", "Claim", "Finding", "Why", "evaluate", "stale_entries", "status_by_artefact", "to_markdown",
           "PAPER_SYSTEMS"]
