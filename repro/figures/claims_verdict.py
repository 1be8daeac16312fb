"""Verdicts of the claims table: noise-aware paired comparisons and the verdict rules
(definitions in repro/figures/claims.py's docstring), plus the number formats of the Ours column.

Knows nothing of results/ or of any one claim: claims_evidence reads the numbers,
claims_rules applies these to one claim's comparisons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

REPRODUCED, PARTLY, NOT, NO_DATA = "reproduced", "partly", "not reproduced", "no data"
WIN, TIE, LOSS = 1, 0, -1
K_SE = 2.0  # a difference counts when it exceeds this many standard errors over seeds
VERDICTS = (REPRODUCED, PARTLY, NOT, NO_DATA)
ABSENT = "—"  # a protocol without cells in the claim's results folder (while another protocol has some)
FACTOR_BAND = 2.0  # numeric claims: within a factor 2 of the paper counts as reproduced
TPUT_TIE = 0.005
LOWER = ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s")
HIGHER = ("hit_rate", "throughput_rps")
SHORT = {
    "latency_p50_s": "P50 latency",
    "latency_p95_s": "P95 latency",
    "ttft_p50_s": "P50 TTFT",
    "ttft_p95_s": "P95 TTFT",
    "hit_rate": "hit rate",
    "throughput_rps": "throughput",
}


@dataclass(frozen=True)
class Finding:
    ours: str
    verdict: str
    per_seed: tuple[float, ...] = ()  # numeric claims: the claim's statistic on each seed's cells alone


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
        return WIN, max(len(seeds), 1)  # not worse within TPUT_TIE (see repro/figures/claims.py)
    sign = 1.0 if metric in HIGHER else -1.0
    if seeds:
        d = np.array([sign * (a[s] - b[s]) for s in seeds])
    else:
        d = np.array([sign * (a_mean - b_mean)])
    return paired(d), max(len(seeds), 1)


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


# -- verdicts --------------------------------------------------------------------------------
def qualitative(checks, unit: str) -> Finding:
    """Verdict from W wins, T ties, L losses (claims.py docstring). `checks`: a Checks, or a list
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
        text += (
            f"; {len(ties)} tie{'s' if len(ties) > 1 else ''} within noise: "
            + "; ".join(ties[:2])
            + (f" (+{len(ties) - 2} more)" if len(ties) > 2 else "")
        )
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


def listed(checks: "Checks", unit: str) -> Finding:
    """qualitative's verdict, with every check's description as the text (and a tie note)."""
    text = "; ".join(d for _, _, d in checks.items)
    if any(o == TIE for o, _, _ in checks.items):
        text += " (tie within noise)"
    return Finding(text, qualitative(checks, unit).verdict)


def numeric(
    ours: float,
    paper: float,
    fmt: Callable[[float], str],
    per: list[str] | None = None,
    direction: int | None = None,
    per_seed: Iterable[float | None] = (),
) -> Finding:
    """Same direction as the paper (sign of the change, or factor > 1) and within FACTOR_BAND.
    `direction`: the noise-aware outcome of "ours differs from no change in the paper's
    direction" (WIN / TIE / LOSS; None: not known, strict). `per_seed`: the statistic per seed,
    carried for the seed spread of REPRODUCE.md's headline table (it decides nothing here)."""
    if ours is None or not math.isfinite(ours):
        return Finding("n/a", NO_DATA)
    seeds = tuple(float(v) for v in per_seed if v is not None and math.isfinite(v))
    same = ours > 1 if fmt is times else (np.sign(ours) == np.sign(paper) and ours != 0)
    close = bool(same) and 1 / FACTOR_BAND <= ours / paper <= FACTOR_BAND
    text = fmt(ours) + (f" ({', '.join(per)})" if per else "")
    if direction == TIE:
        return Finding(text + "; tie within noise", NOT, seeds)
    return Finding(text, REPRODUCED if close else (PARTLY if same else NOT), seeds)


def seedwise(
    stat: Callable[[int], float | None], seeds: Iterable[int], neutral: float, paper_sign: float
) -> int | None:
    """Outcome of the per-seed values stat(seed) against `neutral` in the paper's direction
    (None when fewer than two seeds give a value: no noise estimate)."""
    vals = [v for v in (stat(s) for s in seeds) if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return None
    return paired(paper_sign * (np.array(vals) - neutral))
