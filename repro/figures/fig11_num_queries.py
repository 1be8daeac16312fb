"""Figure 11 (appendix): number of served queries per run (axis reconstructed, see the caption)."""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig11_num_queries",
    exp="fig11_num_queries",
    title="Figure 11: performance vs number of served queries",
    kind="sweep",
    x="workload.num_queries",
    x_label="queries per run",
    x_log=2,
    notes="Appendix figure reconstructed from §5 'More Experiments' (Appendix B is missing from the paper text).",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
