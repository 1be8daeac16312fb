"""Figure 12 (appendix): output length swept from 4 to 128 tokens (§5 "Workloads")."""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig12_output_len",
    exp="fig12_output_len",
    title="Figure 12: performance vs output length",
    kind="sweep",
    x="workload.output_len",
    x_label="output tokens",
    x_log=2,
    notes="Appendix figure reconstructed from §5 (range 4-128 tokens is stated there; Appendix B is missing).",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
