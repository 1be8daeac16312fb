"""Appendix Figure 9 (our reading): Fig. 3's Mixtral-8x7B-Instruct (MoE) on GSP, UltraChat and LooGLE (H200).

The paper's §5 refers to "additional results on other benchmarks" in Appendix B for the
model-size study; the appendix did not survive the text extraction, so which model and which
benchmarks each of Figures 8 and 9 shows is our reading (one figure per model, the three
benchmarks Fig. 3 does not show). results/fig9_mixtral_benchmarks/ (grid: workload x policy, seed 0).
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig9_mixtral_benchmarks",
    exp="fig9_mixtral_benchmarks",
    title="Figure 9 (appendix, our reading): Mixtral-8x7B-Instruct (MoE) on the other benchmarks",
    kind="bars",
    facets=("model.name", "workload.name"),
    notes="Our reading of the paper's Appendix Figure 9: Fig. 3's study on GSP, UltraChat and LooGLE, one figure per "
    "model (the appendix text is not in the paper we have). Mixtral-8x7B in bf16 on one H200 per worker.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
