"""Figure 5: request rate swept from 4 to 20 req/s (Poisson arrivals)."""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig5_request_rate",
    exp="fig5_request_rate",
    title="Figure 5: performance vs request rate",
    kind="sweep",
    x="workload.request_rate",
    x_label="request rate (req/s)",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
