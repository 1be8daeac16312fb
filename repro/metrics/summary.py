"""summary.json from per-request records.

Definitions (ALGORITHMS.md §5): TTFT = first token - arrival; latency = finish - arrival;
hit rate = sum(cached) / sum(prompt) over completed requests; throughput = completed /
(last finish - first arrival). Percentiles use numpy's default (linear) interpolation.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SUMMARY_KEYS: tuple[str, ...] = (
    "num_requests",
    "num_failed",
    "hit_rate",
    "throughput_rps",
    "throughput_tok_s",
    "latency_p50_s",
    "latency_p95_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "makespan_s",
)


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def summarize(records: pd.DataFrame, provenance: dict | None = None) -> dict:
    """Summary dict with exactly SUMMARY_KEYS (+ `provenance`).

    Floats are rounded to 12 significant digits so that the same records always
    serialise to the same bytes, whatever summation order a platform uses.
    """
    failed = records["failed"].to_numpy(dtype=bool) if "failed" in records else np.zeros(len(records), bool)
    done = records[~failed]
    n_done = len(done)
    latency = (done["finish_s"] - done["arrival_s"]).to_numpy(dtype=float)
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy(dtype=float)
    prompt = int(done["prompt_tokens"].sum())
    cached = int(done["cached_tokens"].sum())
    if n_done:
        makespan = float(done["finish_s"].max() - records["arrival_s"].min())
    else:
        makespan = math.nan
    tokens_out = int(done["output_tokens"].sum())
    out = {
        "num_requests": int(len(records)),
        "num_failed": int(failed.sum()),
        "hit_rate": cached / prompt if prompt else math.nan,
        "throughput_rps": n_done / makespan if n_done and makespan > 0 else math.nan,
        "throughput_tok_s": (prompt + tokens_out) / makespan if n_done and makespan > 0 else math.nan,
        "latency_p50_s": _pct(latency, 50),
        "latency_p95_s": _pct(latency, 95),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p95_s": _pct(ttft, 95),
        "makespan_s": makespan,
    }
    out = {k: (float(f"{v:.12g}") if isinstance(v, float) else v) for k, v in out.items()}
    out["provenance"] = dict(provenance or {})
    return out
