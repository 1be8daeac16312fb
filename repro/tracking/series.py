"""A cell's time series: what its W&B run plots over time, kept as one small file with its results.

`cell_series(records, samples)` -> DataFrame, one row per point of a regular time grid:

    sim_time_s               the x axis (simulated seconds; `wall_time_s` for live cells)
    completed                requests finished by then
    window/completed_rps     requests finished in the sliding window / window length
    window/hit_rate          sum(cached) / sum(prompt) over the requests finished in the window
    window/latency_p50_s ... window/ttft_p95_s   percentiles (numpy's linear) over the same requests
    in_flight/w<i>, queue/w<i>, kv_use/w<i>      per worker, from the backend's samples
                                                 (kv_use = KV tokens in use / capacity)

The grid is the backend's (repro.sim.StateSampler: max_points/2 .. max_points points over the
cell's simulated time) or, without samples, max_points/2 points from the first arrival to the
last finish. The window is WINDOW_POINTS grid steps ending at the point; an empty window gives
NaN (not logged). Computed with a handful of numpy passes (the per-window percentiles by one
sort of (window, value) pairs), about a millisecond for a 1024-request cell.

File: `timeseries.parquet` in the cell folder (zstd, window metrics float32), written atomically
(temp file + rename) but, unlike the identity files, not fsynced: a flush costs 3-10 ms here,
half the tracking budget of a cell; a killed process cannot leave a partial file, only a
machine crash right after the cell could (then `repro.tracking.upload` reports that cell). Size cap: at most
max_points rows x (7 + 3 x workers) columns; with the default 320 points that is < 40 KiB for
4 workers and < 80 KiB for 10 (tests/tracking check it). Its key/value metadata `repro.series`
holds the grid step, the window and the cell's swept keys (for the W&B display name).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from repro.results.store import CellStore  # noqa: E402  (the cell folder's format)

SERIES_FILE = CellStore.SERIES
WINDOW_POINTS = 10
META_KEY = b"repro.series"
WINDOW_KEYS = (
    "window/completed_rps",
    "window/hit_rate",
    "window/latency_p50_s",
    "window/latency_p95_s",
    "window/ttft_p50_s",
    "window/ttft_p95_s",
)
WORKER_KEYS = ("in_flight", "queue", "kv_use")


def _window_percentiles(first_win: np.ndarray, values: np.ndarray, k: int, b: int, qs) -> list[np.ndarray]:
    """Percentiles of `values` per window; item i lies in windows first_win[i] .. first_win[i]+b-1."""
    win = (first_win[:, None] + np.arange(b)[None, :]).ravel()
    val = np.repeat(values, b)
    keep = (win >= 0) & (win < k)
    win, val = win[keep], val[keep]
    out = []
    if not len(val):
        return [np.full(k, np.nan) for _ in qs]
    order = np.lexsort((val, win))
    win, val = win[order], val[order]
    counts = np.bincount(win, minlength=k)
    starts = np.cumsum(counts) - counts
    empty = counts == 0
    last = len(val) - 1
    for q in qs:
        pos = starts + q * np.maximum(counts - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, starts + counts - 1)
        frac = pos - lo
        lo_v = val[np.clip(lo, 0, last)]
        hi_v = val[np.clip(hi, 0, last)]
        res = lo_v + (hi_v - lo_v) * frac
        res[empty] = np.nan
        out.append(res)
    return out


def cell_series(
    records: pd.DataFrame,
    samples: Mapping[str, Any] | None = None,
    *,
    max_points: int = 320,
    time_key: str = "sim_time_s",
) -> pd.DataFrame:
    """The cell's time series (module docstring) from its per-request records and backend samples."""
    ok = ~records["failed"].to_numpy(dtype=bool)
    finish = records["finish_s"].to_numpy(dtype=np.float64)[ok]
    order = np.argsort(finish, kind="stable")
    finish = finish[order]
    arrival = records["arrival_s"].to_numpy(dtype=np.float64)[ok][order]
    latency = finish - arrival
    ttft = records["first_token_s"].to_numpy(dtype=np.float64)[ok][order] - arrival
    cached = records["cached_tokens"].to_numpy(dtype=np.float64)[ok][order]
    prompt = records["prompt_tokens"].to_numpy(dtype=np.float64)[ok][order]

    if samples is not None and len(samples["time_s"]) >= 2:
        t = np.asarray(samples["time_s"], dtype=np.float64)
    else:
        all_arr = records["arrival_s"].to_numpy(dtype=np.float64)
        t0 = float(np.nanmin(all_arr)) if len(all_arr) else 0.0
        t1 = float(finish[-1]) if len(finish) else t0
        t = np.linspace(t0, max(t1, t0 + 1e-9), max(2, max_points // 2))
        samples = None
    k = len(t)
    dt = float(t[1] - t[0])
    window = WINDOW_POINTS * dt

    done_by = np.searchsorted(finish, t, side="right")
    before = np.searchsorted(finish, t - window, side="right")
    ccached = np.concatenate([[0.0], np.cumsum(cached)])
    cprompt = np.concatenate([[0.0], np.cumsum(prompt)])
    win_prompt = cprompt[done_by] - cprompt[before]
    with np.errstate(invalid="ignore", divide="ignore"):
        hit = np.where(win_prompt > 0, (ccached[done_by] - ccached[before]) / win_prompt, np.nan)
    first_win = np.ceil((finish - t[0]) / dt - 1e-9).astype(np.int64)
    lat50, lat95 = _window_percentiles(first_win, latency, k, WINDOW_POINTS, (0.5, 0.95))
    tt50, tt95 = _window_percentiles(first_win, ttft, k, WINDOW_POINTS, (0.5, 0.95))

    f32 = np.float32
    cols: dict[str, np.ndarray] = {
        time_key: t,
        "completed": done_by.astype(np.int32),
        "window/completed_rps": ((done_by - before) / window).astype(f32),
        "window/hit_rate": hit.astype(f32),
        "window/latency_p50_s": lat50.astype(f32),
        "window/latency_p95_s": lat95.astype(f32),
        "window/ttft_p50_s": tt50.astype(f32),
        "window/ttft_p95_s": tt95.astype(f32),
    }
    if samples is not None:
        cap = np.maximum(np.asarray(samples["kv_capacity_tokens"], dtype=np.float64), 1.0)
        fl, q, kv = samples["in_flight"], samples["queue"], samples["kv_used_tokens"]
        for w in range(fl.shape[1]):
            cols[f"in_flight/w{w}"] = fl[:, w].astype(np.int32)
            cols[f"queue/w{w}"] = q[:, w].astype(np.int32)
            cols[f"kv_use/w{w}"] = (kv[:, w] / cap[w]).astype(f32)
    return pd.DataFrame(cols)


def series_bytes(series: pd.DataFrame, meta: Mapping[str, Any]) -> bytes:
    """Deterministic parquet bytes (zstd, no pandas metadata), `meta` as JSON in the file metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({str(c): series[c].to_numpy() for c in series.columns})  # ~10x cheaper than from_pandas
    table = table.replace_schema_metadata({META_KEY: json.dumps(dict(meta), sort_keys=True).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def series_meta(series: pd.DataFrame, *, swept: Mapping[str, Any] | None = None) -> dict:
    t = series.iloc[:, 0].to_numpy()
    dt = float(t[1] - t[0]) if len(t) > 1 else math.nan
    return {
        "time_key": str(series.columns[0]),
        "step_s": dt,
        "window_s": WINDOW_POINTS * dt,
        "swept": {str(k): str(v) for k, v in (swept or {}).items()},
    }


def read_series(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """(series, meta) of a timeseries.parquet."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = json.loads(raw) if raw else {"time_key": table.column_names[0], "swept": {}}
    return table.to_pandas(), meta


__all__ = ["SERIES_FILE", "WINDOW_KEYS", "WORKER_KEYS", "cell_series", "read_series", "series_bytes", "series_meta"]
