"""Figure 13 (appendix): maximum batch size = SGLang's max_running_requests per worker."""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig13_batch_size",
    exp="fig13_batch_size",
    title="Figure 13: performance vs maximum batch size",
    kind="sweep",
    x="cluster.scheduler.max_running_requests",
    x_label="max running requests per worker",
    x_log=2,
    notes="Appendix figure reconstructed from §5 'More Experiments' (Appendix B is missing): our reading of "
    "'maximum batch size' is SGLang's max_running_requests.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
