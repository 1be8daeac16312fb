"""Figure 14 (appendix): LBGR's queue-load decay interval Δt (decay factor γ fixed).

A longer interval decays the queue-load estimate less often, so it is staler and larger
(ALGORITHMS.md §3). Systems without the knob (Cache-Aware) are dashed reference lines.
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig14_decay_interval",
    exp="fig14_decay_interval",
    title="Figure 14: LBGR performance vs queue-load decay interval Δt",
    kind="sweep",
    x="router.decay_interval_s",
    x_label="decay interval Δt (s)",
    x_log=10,
    notes="Appendix figure reconstructed from §5's ablation paragraph (Appendix B is missing): Δt swept with the "
    "decay factor γ fixed; dotted lines are systems without the knob.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
