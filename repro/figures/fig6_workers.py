"""Figure 6: number of workers swept from 2 to 10 (12 req/s fixed)."""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig6_workers",
    exp="fig6_workers",
    title="Figure 6: performance vs number of workers",
    kind="sweep",
    x="cluster.num_workers",
    x_label="workers",
    notes="The request rate stays at the default, so throughput is capped by the offered load once the "
    "cluster keeps up (the paper's 'converges at >= 6 workers').",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
