"""Figure 3: model size and architecture — Llama-3.1-70B and Mixtral-8x7B on ShareGPT (H200).

results/fig3_models/ (grid: model x policy). Llama-3.1-70B does not fit one H200 in bf16: the
config assumes FP8 weights on one H200 per worker (ARCHITECTURE.md "Experiment defaults");
the caption prints the weight dtype and tensor parallelism read from each cell's config.
"""

from repro.figures.perf import PerfFigure

FIGURE = PerfFigure(
    name="fig3_models",
    exp="fig3_models",
    title="Figure 3: a large dense model and a sparse MoE model",
    kind="bars",
    facets=("model.name", "workload.name"),
    notes="The paper's Figure 3 shows ShareGPT; other benchmarks are its appendix rows. "
    "Our choice: Llama-3.1-70B with FP8 weights (~70 GB) on one H200 per worker (bf16 does not fit); "
    "the paper does not say how it fitted the model. Tokens: Llama-3's tokenizer for every row, also "
    "Mixtral's (its 32k SentencePiece vocabulary is not available offline), so Mixtral's prompts have "
    "Llama-3 lengths.",
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
