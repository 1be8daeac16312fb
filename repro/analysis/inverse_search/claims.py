"""The headline claims the inverse search maximises, and their numbers in one unit.

A claim compares two systems on one metric. Its statement, systems, metric and the paper's printed
number are read from the claims catalogue (repro/figures/claims_catalogue.yaml, as data: the
number is written there once); this module adds which settings each claim's figure fixes.

Every ratio is handled as an *advantage* a >= 0, larger = the paper's direction: base / ours for a
lower-is-better metric (latency, TTFT), ours / base for a higher-is-better one (hit rate,
throughput). The printed number is a function of a: "11.96×" is a = 11.96, "+36.45 %" is
a = 1.3645, "−28.1 %" (a reduction of a latency) is a = 1 / (1 − 0.281).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml

CATALOGUE = Path(__file__).resolve().parents[2] / "figures" / "claims_catalogue.yaml"
LOWER_IS_BETTER = frozenset({"latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s"})
HIGHER_IS_BETTER = frozenset({"hit_rate", "throughput_rps"})
# Figure 2's four headline numbers (LBGR+RLT vs CacheAware+LRU), which `fig2.joint` asks for at once.
FIG2_FOUR = ("fig2.p50_latency_vs_ca", "fig2.p50_ttft_vs_ca", "fig2.hit_vs_ca", "fig2.tput_vs_ca")
JOINT = "fig2.joint"
BENCHMARKS = ("gsp", "sharegpt", "ultrachat", "loogle")

# What each claim's figure fixes (conf/exp/fig4_order.yaml: LooGLE in round-robin order;
# conf/exp/tab2_ablation.yaml: GSP); everything else is searched.
FIXED_BY_ARTEFACT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # artefact: (benchmarks searched, further fixed overrides)
    "fig2_main": (BENCHMARKS, ()),
    "fig4_order": (("loogle",), ("workload.order=round_robin",)),
    "tab2_ablation": (("gsp",), ()),
}
SEARCHED = (*FIG2_FOUR, "fig4.latency_vs_ca", "tab2.ca_rlt_latency")

CHANGE_FLOOR = 1e-3  # 0.1 %: the smallest relative change a factor distance takes (see factor_distance)
_NUMBER = re.compile(r"^([+−-]?)(\d+(?:\.\d+)?)\s*(×|%)$")


@dataclass(frozen=True)
class SearchClaim:
    id: str
    statement: str
    paper: str  # as printed: "11.96×", "+36.45 %", "−28.1 %"
    base: str  # policy options (conf: policy=<router>_<eviction>)
    ours: str
    metric: str
    benchmarks: tuple[str, ...]
    fixed: tuple[str, ...]

    @property
    def unit(self) -> str:
        return _parse(self.paper)[2]

    @property
    def paper_advantage(self) -> float:
        sign, mag, unit = _parse(self.paper)
        if unit == "×":
            return mag
        return to_advantage(self.metric, sign * mag / 100.0)

    def advantage(self, base_value: float, ours_value: float) -> float:
        return advantage(self.metric, base_value, ours_value)

    def printed(self, adv: float) -> str:
        """An advantage in the paper's unit: '3.2×' or '+12.5 %' / '−8.0 %'."""
        if self.unit == "×":
            return f"{adv:.3g}×"
        c = from_advantage(self.metric, adv) * 100.0
        return f"{'+' if c >= 0 else '−'}{abs(c):.3g} %"

    def factor_distance(self, adv: float) -> float:
        """|log2(our printed number / the paper's)|: <= 1 means within a factor 2 of the paper's number
        (the claims table's band for 'reproduced'). A relative change below CHANGE_FLOOR in the
        paper's direction (or against it) counts as CHANGE_FLOOR, so the distance stays finite and
        a joint search still ranks settings; nan (undefined ratio) is inf."""
        if not math.isfinite(adv) or adv <= 0:
            return math.inf
        if self.unit == "×":
            return abs(math.log2(adv / self.paper_advantage))
        paper = from_advantage(self.metric, self.paper_advantage)
        ours = max(from_advantage(self.metric, adv) * math.copysign(1.0, paper), CHANGE_FLOOR)
        return abs(math.log2(ours / abs(paper)))


def _parse(text: str) -> tuple[int, float, str]:
    m = _NUMBER.match(text.strip())
    if not m:
        raise ValueError(f"no number in {text!r}")
    return (-1 if m.group(1) in ("−", "-") else 1), float(m.group(2)), m.group(3)


def advantage(metric: str, base_value: float, ours_value: float) -> float:
    """base / ours for a lower-is-better metric, ours / base otherwise (nan if undefined)."""
    num, den = (base_value, ours_value) if metric in LOWER_IS_BETTER else (ours_value, base_value)
    if metric not in LOWER_IS_BETTER | HIGHER_IS_BETTER:
        raise ValueError(f"no direction known for metric {metric!r}")
    if not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return math.nan
    return num / den


def to_advantage(metric: str, change: float) -> float:
    """A relative change of ours against base (ours / base − 1) as an advantage."""
    return 1.0 / (1.0 + change) if metric in LOWER_IS_BETTER else 1.0 + change


def from_advantage(metric: str, adv: float) -> float:
    return 1.0 / adv - 1.0 if metric in LOWER_IS_BETTER else adv - 1.0


def _policy_of(display: str, policies: Mapping[str, dict]) -> str:
    names = [p for p, node in policies.items() if node.get("policy_name") == display]
    if len(names) != 1:
        raise ValueError(f"system {display!r} names {len(names)} policy options")
    return names[0]


def load_claims() -> dict[str, SearchClaim]:
    """The searched claims, read from the catalogue (ValueError if an entry no longer fits)."""
    from hydra_plugins.repro_policies import policies

    entries = {e["id"]: e for e in (yaml.safe_load(CATALOGUE.read_text()) or {}).get("claims", [])}
    pol = policies()
    out = {}
    for cid in SEARCHED:
        e = entries[cid]
        benchmarks, fixed = FIXED_BY_ARTEFACT[e["artefact"]]
        out[cid] = SearchClaim(
            id=cid,
            statement=e["statement"],
            paper=e["paper"],
            base=_policy_of(e["base"], pol),
            ours=_policy_of(e["ours"], pol),
            metric=e["metric"],
            benchmarks=benchmarks,
            fixed=fixed,
        )
    return out


def fig2_distances(claims: Mapping[str, SearchClaim], advantages: Mapping[str, float]) -> dict[str, float]:
    """Figure 2's four numbers: each one's factor distance to the paper's."""
    return {c: claims[c].factor_distance(advantages.get(claims[c].metric, math.nan)) for c in FIG2_FOUR}


def joint_distance(claims: Mapping[str, SearchClaim], advantages: Mapping[str, float]) -> float:
    """The largest of the four factor distances: <= 1 when all four lie within a factor 2 of the
    paper's (they co-occur)."""
    return max(fig2_distances(claims, advantages).values())


def joint_score(claims: Mapping[str, SearchClaim], advantages: Mapping[str, float]) -> float:
    """`fig2.joint`'s objective (minimised): the mean of the four factor distances. Not their maximum,
    which stays flat while any one number points the wrong way; co-occurrence is judged on the
    maximum (joint_distance)."""
    d = fig2_distances(claims, advantages).values()
    return sum(d) / len(d)


@dataclass(frozen=True)
class Target:
    """What one study optimises: a claim's advantage (maximise), or for `fig2.joint` the mean factor
    distance of Figure 2's four numbers to the paper's (minimise: joint_score)."""

    id: str
    base: str
    ours: str
    benchmarks: tuple[str, ...]
    fixed: tuple[str, ...]
    direction: str  # maximize | minimize (Optuna's words)
    claim: SearchClaim | None

    def value(self, claims: Mapping[str, SearchClaim], advantages: Mapping[str, float]) -> float:
        if self.claim is None:
            return joint_score(claims, advantages)
        return advantages.get(self.claim.metric, math.nan)

    def printed(self, value: float) -> str:
        return self.claim.printed(value) if self.claim is not None else f"{value:.3g} (mean log2 factor)"

    @property
    def paper(self) -> str:
        return self.claim.paper if self.claim is not None else "all four at once (0)"


def targets(claims: Mapping[str, SearchClaim] | None = None) -> dict[str, Target]:
    claims = load_claims() if claims is None else claims
    out = {cid: Target(cid, c.base, c.ours, c.benchmarks, c.fixed, "maximize", c) for cid, c in claims.items()}
    lat = claims[FIG2_FOUR[0]]
    out[JOINT] = Target(JOINT, lat.base, lat.ours, lat.benchmarks, lat.fixed, "minimize", None)
    return out
