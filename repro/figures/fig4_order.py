"""Figure 4: worst-case (round-robin) query order on LooGLE.

results/fig4_order/ (grid: policy; workload loogle with order round_robin: one question from
each document in turn, cycling — LRU's adversary).
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig4_order",
    exp="fig4_order",
    title="Figure 4: LooGLE under the worst-case round-robin query order",
    kind="bars",
    facets=("workload.name", "workload.order"),
    notes="Round-robin order = one question per document in turn (ALGORITHMS.md §4).",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
