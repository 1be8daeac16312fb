"""Figure 10 (appendix): shared-prefix ratio of GSP.

Appendix B did not survive the paper's text extraction: the axis is our reconstruction from
§5 "More Experiments" — ratio = system-prompt tokens / (system-prompt + question tokens) at a
fixed total prompt length (ALGORITHMS.md §4, repro/workloads/gsp.py).
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig10_prefix_ratio",
    exp="fig10_prefix_ratio",
    title="Figure 10: performance vs shared-prefix ratio",
    kind="sweep",
    x="workload.shared_prefix_ratio",
    x_label="shared-prefix ratio",
    notes="Appendix figure reconstructed from §5 'More Experiments' (Appendix B is missing from the paper text): "
    "ratio = system-prompt / (system-prompt + question) tokens at a fixed total prompt length.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
