"""Fig. 2 under both cache-aware rules (beyond the paper): the six systems on Fig. 2's cells, plus
Cache-Aware+LRU / +RLT under sglang-router <= 0.2.3's low-match rule (smallest tree).

Only the cache-aware rows depend on the rule, so results/fig2_router_rules/ holds just those
rows under the old rule (router.low_match=smallest_tree); every other bar, and the cache-aware
bars under sglang-router 0.3.2's rule (least loaded, the default), are Fig. 2's own cells from
results/fig2_main/ (same benchmarks, settings and seeds). The old-rule rows are labelled
"<system> (<=0.2.3)". The caption quotes the headline ratio (Cache-Aware+LRU / LBGR+RLT P50
latency) per benchmark under each rule.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.figures.load import SYSTEM, load_cells, require
from repro.figures.perf import PerfFigure, _facet_rank

NAME = EXP = "fig2_router_rules"
BASE_EXP = "fig2_main"
OLD = " (<=0.2.3)"
RULE = "router.low_match"


class RuleFigure(PerfFigure):
    def cells(self, results_dir: str | Path) -> pd.DataFrame:
        old = require(load_cells(results_dir, self.exp), self.exp, [SYSTEM]).copy()
        base = require(load_cells(results_dir, BASE_EXP), BASE_EXP, [SYSTEM]).copy()
        bad = old[old.get(RULE, pd.Series("smallest_tree", index=old.index)) != "smallest_tree"]
        if len(bad):
            raise ValueError(f"results/{self.exp}/: cells {sorted(bad['signature'])} are not under the old rule "
                             f"({RULE}=smallest_tree)")
        ca = base[base[SYSTEM].str.startswith("CacheAware")]
        rule = ca[RULE] if RULE in ca else pd.Series(None, index=ca.index, dtype=object)
        if len(ca) and not (rule == "least_loaded").all():
            raise ValueError(f"results/{BASE_EXP}/: cache-aware cells {sorted(ca.loc[rule != 'least_loaded', 'signature'])} "
                             f"are not under sglang-router 0.3.2's rule ({RULE}=least_loaded; cells from before the "
                             f"rule existed have no {RULE}): rerun fig2_main")
        old[SYSTEM] = old[SYSTEM] + OLD
        df = pd.concat([base, old], ignore_index=True, sort=False)
        df.attrs = dict(base.attrs)
        df.attrs["summary_columns"] = sorted(set(base.attrs.get("summary_columns", ()))
                                             | set(old.attrs.get("summary_columns", ())))
        # the rule is what the labels show; the pooling check must not see it as a hidden difference
        return df.drop(columns=[c for c in (RULE, "exp", "router.worker_order", "exp_name") if c in df])


def headline(df: pd.DataFrame) -> str:
    """Cache-Aware+LRU / LBGR+RLT P50 latency per benchmark under each rule (seed means)."""
    m = "latency_p50_s"
    if "workload.name" not in df:
        return ""
    means = df.groupby(["workload.name", SYSTEM])[m].mean()
    parts = []
    for wl in sorted(set(df["workload.name"]), key=lambda w: _facet_rank("workload.name", w)):
        try:
            ours = means[(wl, "LBGR+RLT")]
            new, old = means[(wl, "CacheAware+LRU")], means[(wl, "CacheAware+LRU" + OLD)]
        except KeyError:
            continue
        parts.append(f"{wl} {new / ours:.2f}x (0.3.2) vs {old / ours:.2f}x (<=0.2.3)")
    if not parts:
        return ""
    return "Cache-Aware+LRU / LBGR+RLT P50 latency (> 1: LBGR+RLT faster): " + "; ".join(parts) + "."


FIGURE = RuleFigure(
    name=NAME,
    exp=EXP,
    title="Fig. 2 under both cache-aware rules: sglang-router 0.3.2 (least loaded) vs <=0.2.3 (smallest tree)",
    kind="bars",
    facets=("workload.name",),
    notes="Beyond the paper. Bars: the six systems of Fig. 2 (cache-aware rows: sglang-router 0.3.2's rule, a low "
    "match goes to the least-loaded worker), then Cache-Aware+LRU / +RLT under the rule of sglang-router <= 0.2.3 "
    "(a low match goes to the worker with the smallest tree), labelled (<=0.2.3). All rows other than the "
    "(<=0.2.3) ones are results/fig2_main/'s cells.",
    caption_extra=headline,
)
render = FIGURE.render

