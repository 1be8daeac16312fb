"""Figure 2: the six systems on the four benchmarks (GSP, ShareGPT, UltraChat, LooGLE).

results/fig2_main/ (grid: workload x policy x seeds 0-2, Llama-3.1-8B on L40, 4 workers,
12 req/s, 4 output tokens, random order). Bars: mean over seeds, error bars ± SD.
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig2_main",
    exp="fig2_main",
    title="Figure 2: end-to-end performance of the six systems on four benchmarks",
    kind="bars",
    facets=("workload.name",),
    notes="Bars in system order: Random+LRU, RoundRobin+LRU, CacheAware+LRU (baselines), CacheAware+RLT, "
    "LBGR+LRU, LBGR+RLT (the paper's methods).",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
