"""Figure 7: KV cache size, via the GPU memory fraction (50-90 % on L40).

KV capacity per worker = (GPU memory x mem_fraction - weights) / KV bytes per token; the
caption lists the capacities the cells actually used (provenance kv_capacity_tokens).
"""

import pandas as pd

from repro.figures.perf import PerfFigure


def capacities(df: pd.DataFrame) -> str:
    col, x = "prov.kv_capacity_tokens", "cluster.mem_fraction"
    if col not in df or x not in df:
        return ""
    pairs = {}
    for frac, cap in zip(df[x], df[col]):
        first = cap[0] if isinstance(cap, tuple) and cap else cap
        if first is not None and frac is not None:
            pairs.setdefault(float(frac), int(first))
    if not pairs:
        return ""
    body = ", ".join(f"{f * 100:g} % -> {c:,}" for f, c in sorted(pairs.items()))
    return f"KV capacity per worker (tokens): {body}."


FIGURE = PerfFigure(
    name="fig7_cache_size",
    exp="fig7_cache_size",
    title="Figure 7: performance vs KV cache size (GPU memory fraction)",
    kind="sweep",
    x="cluster.mem_fraction",
    x_label="GPU memory fraction (%)",
    x_percent=True,
    caption_extra=capacities,
)
NAME, EXP, render = FIGURE.name, FIGURE.exp, FIGURE.render
