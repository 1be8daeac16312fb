"""Appendix Figure 8 (our reading): Fig. 3's Llama-3.1-70B-Instruct on GSP, UltraChat and LooGLE (H200).

The paper's §5 refers to "additional results on other benchmarks" in Appendix B for the
model-size study; the appendix did not survive the text extraction, so which model and which
benchmarks each of Figures 8 and 9 shows is our reading (one figure per model, the three
benchmarks Fig. 3 does not show). results/fig8_llama70b_benchmarks/ (grid: workload x policy, seed 0).
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig8_llama70b_benchmarks",
    exp="fig8_llama70b_benchmarks",
    title="Figure 8 (appendix, our reading): Llama-3.1-70B-Instruct on the other benchmarks",
    kind="bars",
    facets=("model.name", "workload.name"),
    notes="Our reading of the paper's Appendix Figure 8: Fig. 3's study on GSP, UltraChat and LooGLE, one figure per "
    "model (the appendix text is not in the paper we have). Llama-3.1-70B with FP8 weights (~70 GB) on one H200 per worker (bf16 does not fit); the paper does not say how it fitted the model.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
