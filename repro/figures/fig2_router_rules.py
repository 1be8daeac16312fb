"""Fig. 2 under three generations of the cache-aware router (beyond the paper): the six systems
on Fig. 2's cells, plus Cache-Aware+LRU / +RLT under sglang-router <= 0.2.3's rule (a low match
goes to the smallest tree) and under smg 1.13.0's (its successor: per-request spill gate).

Only the cache-aware rows depend on the rule, so results/fig2_router_rules/ holds just those
rows under the two other rules (router.generation=le_0_2_3 | smg_1_13); every other bar, and
the cache-aware bars under sglang-router 0.3.2's rule (generation v0_3_2, the default), are
Fig. 2's own cells from results/fig2_main/ (same benchmarks, settings and seeds). The other
rules' rows are labelled "<system> (<=0.2.3)" and "<system> (smg 1.13)". The caption quotes the
headline ratio (Cache-Aware+LRU / LBGR+RLT P50 latency) per benchmark under each rule.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from repro.figures.load import SYSTEM, load_cells, require
from repro.figures.perf import PerfFigure, _facet_rank

NAME = EXP = "fig2_router_rules"
BASE_EXP = "fig2_main"
OLD = " (<=0.2.3)"
SMG = " (smg 1.13)"
RULE = "router.generation"
LABELS = {"le_0_2_3": OLD, "smg_1_13": SMG}  # this experiment's rules; v0_3_2's rows are fig2_main's


class RuleFigure(PerfFigure):
    def cells(self, results_dir: str | Path) -> pd.DataFrame:
        old = require(load_cells(results_dir, self.exp), self.exp, [SYSTEM]).copy()
        base = require(load_cells(results_dir, BASE_EXP), BASE_EXP, [SYSTEM]).copy()
        rules = old[RULE] if RULE in old else pd.Series(None, index=old.index, dtype=object)
        bad = old[~rules.isin(list(LABELS))]
        if len(bad):
            raise ValueError(
                f"results/{self.exp}/: cells {sorted(bad['signature'])} are not under the other rules "
                f"({RULE} in {sorted(LABELS)}; cells from before {RULE} existed have none): "
                f"rerun {self.exp}"
            )
        ca = base[base[SYSTEM].str.startswith("CacheAware")]
        rule = ca[RULE] if RULE in ca else pd.Series(None, index=ca.index, dtype=object)
        if len(ca) and not (rule == "v0_3_2").all():
            raise ValueError(
                f"results/{BASE_EXP}/: cache-aware cells {sorted(ca.loc[rule != 'v0_3_2', 'signature'])} "
                f"are not under sglang-router 0.3.2's rule ({RULE}=v0_3_2; cells from before the "
                f"key existed have no {RULE}): rerun fig2_main"
            )
        old[SYSTEM] = old[SYSTEM] + rules.map(LABELS)
        df = pd.concat([base, old], ignore_index=True, sort=False)
        df.attrs = dict(base.attrs)
        df.attrs["summary_columns"] = sorted(
            set(base.attrs.get("summary_columns", ())) | set(old.attrs.get("summary_columns", ()))
        )
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
            ratios = [
                f"{means[(wl, 'CacheAware+LRU' + label)] / ours:.2f}x ({label.strip(' ()') or '0.3.2'})"
                for label in ("", OLD, SMG)
                if (wl, "CacheAware+LRU" + label) in means.index
            ]
        except KeyError:
            continue
        if len(ratios) > 1:
            parts.append(f"{wl} " + " vs ".join(ratios))
    if not parts:
        return ""
    return "Cache-Aware+LRU / LBGR+RLT P50 latency (> 1: LBGR+RLT faster): " + "; ".join(parts) + "."


FIGURE = RuleFigure(
    name=NAME,
    exp=EXP,
    title="Fig. 2 under three cache-aware rules: sglang-router 0.3.2, <=0.2.3 (smallest tree), smg 1.13 (spill gate)",
    kind="bars",
    facets=("workload.name",),
    notes="Beyond the paper. Bars: the six systems of Fig. 2 (cache-aware rows: sglang-router 0.3.2's rule, a low "
    "match goes to the least-loaded worker), then Cache-Aware+LRU / +RLT under the rule of sglang-router <= 0.2.3 "
    "(a low match goes to the worker with the smallest tree), labelled (<=0.2.3), and under smg 1.13.0's rule "
    "(no global imbalance test; a hit goes to the least-loaded holder of the prefix unless it is over 1.5x and "
    "ceil(2 sqrt(mean)) above the mean load; random load ties), labelled (smg 1.13). All rows other than the "
    "(<=0.2.3) and (smg 1.13) ones are results/fig2_main/'s cells.",
    caption_extra=headline,
)
render = FIGURE.render
