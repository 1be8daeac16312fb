"""REPRODUCE.md's headline table: the four Fig. 2 numbers and Table 2's, paper / artifact protocol /
text protocol, each with its seed spread (generated block `headline`, from the claims table).

A number is the claim's statistic as the claims table computes it (e.g. the mean over benchmarks
of the per-benchmark ratio of seed-averaged metrics); its spread is the min–max over seeds of the
same statistic computed on one seed's cells alone (the seeds every compared system ran), so a
reader sees how far a single seed's run can land from the mean. The verdict is the claims
table's (rules unchanged).
"""

from __future__ import annotations

import pandas as pd

from repro.figures.claims_verdict import ABSENT, pct, times
from repro.figures.load import PROTOCOLS

# (claim id, what the row shows) in the table's order: Fig. 2's four headline ratios, then Table 2's.
HEADLINE: tuple[tuple[str, str], ...] = (
    ("fig2.p50_latency_vs_ca", "Fig. 2 P50 latency, LBGR+RLT vs CacheAware+LRU (mean of per-benchmark ratios)"),
    ("fig2.p50_ttft_vs_ca", "Fig. 2 P50 TTFT, LBGR+RLT vs CacheAware+LRU"),
    ("fig2.hit_vs_ca", "Fig. 2 hit rate, LBGR+RLT vs CacheAware+LRU (relative change)"),
    ("fig2.tput_vs_ca", "Fig. 2 throughput, LBGR+RLT vs CacheAware+LRU (relative change)"),
    ("tab2.ca_rlt_latency", "Table 2 P50 latency, CacheAware+RLT vs CacheAware+LRU"),
    ("tab2.ca_rlt_ttft", "Table 2 P50 TTFT, CacheAware+RLT vs CacheAware+LRU"),
    ("tab2.lbgr_lru_latency", "Table 2 P50 latency, LBGR+LRU vs CacheAware+LRU"),
    ("tab2.lbgr_lru_ttft", "Table 2 P50 TTFT, LBGR+LRU vs CacheAware+LRU"),
    ("tab2.lbgr_rlt_latency", "Table 2 P50 latency, LBGR+RLT vs CacheAware+LRU"),
    ("tab2.lbgr_rlt_ttft", "Table 2 P50 TTFT, LBGR+RLT vs CacheAware+LRU"),
)


def _fmt(claim_rule: str, paper: str):
    """The claims table's number format of a numeric claim (its rule and the paper's unit)."""
    if claim_rule == "reduction":
        return lambda z: pct(-z)
    return times if paper.strip().endswith("×") else pct


def _value(ours: str) -> str:
    """The claim's number from its Ours text ('1.02× (gsp 1.04×, ...); tie within noise' -> '1.02×')."""
    return ours.split(" (", 1)[0].split(";", 1)[0].strip()


def cell(row: pd.Series, protocol: str, fmt, flip: bool = False) -> str:
    """ "1.02× (seeds 1.01× to 1.04×, n = 3); not reproduced". flip: fmt reverses the order (a
    reduction shown as a negative change), so the spread still reads from low to high."""
    verdict = row.get(f"verdict:{protocol}", ABSENT)
    if verdict == ABSENT:
        return ABSENT
    per_seed = tuple(row.get(f"per_seed:{protocol}") or ())
    text = _value(str(row[f"ours:{protocol}"]))
    if len(per_seed) > 1:
        lo, hi = (max(per_seed), min(per_seed)) if flip else (min(per_seed), max(per_seed))
        text += f" (seeds {fmt(lo)} to {fmt(hi)}, n = {len(per_seed)})"
    elif len(per_seed) == 1:
        text += " (one seed)"
    return f"{text}; {verdict}"


def headline_block(claims_table: pd.DataFrame) -> str:
    """The generated `headline` block of REPRODUCE.md."""
    from repro.figures.claims_catalogue import CLAIMS

    rules = {c.id: c.rule for c in CLAIMS}
    by_id = claims_table.set_index("id")
    protocols = [p for p in PROTOCOLS if f"verdict:{p}" in claims_table]
    lines = [
        "| Number | Paper | " + " | ".join(f"{p.capitalize()} protocol" for p in protocols) + " |",
        "|:---|---:|" + "|".join(":---" for _ in protocols) + "|",
    ]
    for cid, what in HEADLINE:
        if cid not in by_id.index:
            continue
        row = by_id.loc[cid]
        fmt = _fmt(rules.get(cid, ""), str(row["paper"]))
        flip = rules.get(cid) == "reduction"
        lines.append(f"| {what} | {row['paper']} | " + " | ".join(cell(row, p, fmt, flip) for p in protocols) + " |")
    lines += [
        "",
        "Each number is the claims table's (`figures/claims.md`, same verdict rules): the mean over benchmarks "
        "of the per-benchmark comparison of seed-averaged metrics; in brackets the seed spread, the min and max "
        "over seeds of the same statistic computed on one seed's cells alone (n = the seeds every compared "
        "system ran). Artifact protocol: the authors' scripts (sglang-router 0.1.4's cache-aware rule, LBGR and "
        f"RLT as shipped, SGLang 0.4.6 server defaults, their workloads and metrics); text: the paper's text; "
        f"{ABSENT}: no cells of that protocol.",
    ]
    return "\n".join(lines) + "\n"


__all__ = ["HEADLINE", "headline_block"]
