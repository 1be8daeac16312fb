"""The shared shape of the paper's tables: one row per system (or per workload x eviction),
cells "mean ± SD" over seeds, written as Markdown and LaTeX by repro.figures.style.write_table.
"""

from __future__ import annotations

import math

import pandas as pd

# column title, metric, scale to display units, significant digits
TIME_MS = 1e3
PERF_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("P50 latency (ms)", "latency_p50_s", TIME_MS),
    ("P95 latency (ms)", "latency_p95_s", TIME_MS),
    ("P50 TTFT (ms)", "ttft_p50_s", TIME_MS),
    ("P95 TTFT (ms)", "ttft_p95_s", TIME_MS),
    ("Hit rate (%)", "hit_rate", 100.0),
    ("Throughput (req/s)", "throughput_rps", 1.0),
)
OVERHEAD_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("Eviction (ms/query)", "eviction_ms_per_query", 1.0),
    ("Routing (ms/query)", "routing_ms_per_query", 1.0),
)


def decimals(v: float, digits: int = 3) -> int:
    """Decimals that show `digits` significant digits of v (none for large numbers)."""
    if v == 0 or math.isnan(v):
        return 0
    return max(0, digits - 1 - math.floor(math.log10(abs(v))))


def fmt(v: float, digits: int = 3) -> str:
    """Fixed significant digits, no exponent for the magnitudes tables show."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{decimals(v, digits)}f}"


def mean_sd(mean: float, sd: float, n: int, scale: float) -> str:
    """'mean ± SD' with the SD at the mean's precision (3 significant digits of the mean)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    d = decimals(mean * scale)
    text = f"{mean * scale:.{d}f}"
    if n > 1:
        text += f" ± {sd * scale:.{d}f}"
    return text


def display(agg: pd.DataFrame, label_columns: dict[str, str], columns) -> pd.DataFrame:
    """agg (from repro.figures.load.aggregate) -> display strings."""
    out = pd.DataFrame({title: agg[col].map(str) for title, col in label_columns.items()})
    for title, metric, scale in columns:
        out[title] = [mean_sd(m, s, n, scale) for m, s, n in zip(agg[metric], agg[f"{metric}_sd"], agg["n_seeds"])]
    return out
