"""summary.json from per-request records.

Definitions (ALGORITHMS.md §5): TTFT = first token - arrival; latency = finish - arrival;
hit rate = sum(cached) / sum(prompt) over completed requests; throughput = completed /
(last finish - first arrival). Percentiles use numpy's default (linear) interpolation.
The load regime and the numbers it is judged by: ALGORITHMS.md §5, "Load regime".

`definition="artifact"` (protocol=artifact): the authors' scripts' definitions. Their clients
send warm-up requests first (the workload's client says how many: `provenance["workload"]
["client"]["warmup_requests"]`, the first record ids) and time only what follows: latency and
TTFT are measured on the client from send (bench_serving, long.py, multi-turn.py: the router is
inside that time, as in ours), their percentiles and the throughput (completed / (first timed
send -> last completion)) over the timed requests; the hit rate is read from the workers'
counters (`sglang:cached_tokens_total / sglang:prompt_tokens_total` summed over the workers),
which count every request the servers finished, the warm-up included.
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
    "util_mean",
    "util_max",
    "wait_share_p50",
    "wait_share_p95",
    "backlog_slope_rps",
    "max_worker_share",
    "regime",
)
TEXT_SUMMARY_KEYS: tuple[str, ...] = ("regime",)  # every other key is a number

# Provenance key a backend fills with each worker's busy seconds (time spent executing steps),
# one entry per worker; absent (live backends): util_mean / util_max are NaN.
WORKER_BUSY_KEY = "worker_busy_s"

REGIMES: tuple[str, ...] = ("stable", "backlogged", "overloaded")
# Overloaded: the backlog grows by >= 1 request per 25 arrivals over the arrival window (the
# cluster cannot keep up). Backlogged: not overloaded, but the median request waits at least as
# long in a queue as it is served, or some worker is busy >= 90 % of the makespan. Why these
# values: ALGORITHMS.md §5 "Load regime" (measured on simulated cells).
OVERLOAD_GROWTH_SHARE = 0.04
BACKLOG_WAIT_SHARE = 0.5
BACKLOG_UTIL = 0.9


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def backlog_slope_rps(arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """Least-squares slope of the backlog (arrived, not finished) against time, in requests/s.

    The backlog is read just after each arrival (t_k: k + 1 arrivals - finishes <= t_k), over the
    arrival window [first arrival, last arrival]; NaN with fewer than two distinct arrival times.
    """
    arrival = np.sort(np.asarray(arrival_s, dtype=float))
    if len(arrival) < 2 or arrival[-1] <= arrival[0]:
        return math.nan
    finish = np.sort(np.asarray(finish_s, dtype=float))
    arrived = np.searchsorted(arrival, arrival, side="right")  # ties: after all arrivals at t_k
    backlog = arrived - np.searchsorted(finish, arrival, side="right")
    t = arrival - arrival.mean()
    return float(np.dot(t, backlog - backlog.mean()) / np.dot(t, t))


def load_regime(backlog_slope: float, arrival_rate: float, wait_share_p50: float, util_max: float) -> str | None:
    """ "stable" / "backlogged" / "overloaded" (thresholds above); None without a backlog slope.

    A NaN wait share or utilisation (live backends: no busy time; no queue time without SGLang's
    --enable-metrics) is no evidence of a backlog."""
    if math.isnan(backlog_slope) or not arrival_rate > 0:
        return None
    if backlog_slope >= OVERLOAD_GROWTH_SHARE * arrival_rate:
        return "overloaded"
    if wait_share_p50 >= BACKLOG_WAIT_SHARE or util_max >= BACKLOG_UTIL:
        return "backlogged"
    return "stable"


METRIC_DEFINITIONS: tuple[str, ...] = ("text", "artifact")


def summarize(records: pd.DataFrame, provenance: dict | None = None, definition: str = "text") -> dict:
    """Summary dict with exactly SUMMARY_KEYS (+ `provenance`).

    Floats are rounded to 12 significant digits so that the same records always
    serialise to the same bytes, whatever summation order a platform uses; the regime is judged
    on the rounded numbers. `definition`: METRIC_DEFINITIONS (module docstring).
    """
    if definition == "artifact":
        return _summarize_artifact(records, provenance)
    if definition != "text":
        raise ValueError(f"metric definition must be one of {', '.join(METRIC_DEFINITIONS)}; got {definition!r}")
    provenance = dict(provenance or {})
    failed = records["failed"].to_numpy(dtype=bool) if "failed" in records else np.zeros(len(records), bool)
    done = records[~failed]
    n_done = len(done)
    arrival = done["arrival_s"].to_numpy(dtype=float)
    finish = done["finish_s"].to_numpy(dtype=float)
    latency = finish - arrival
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
        **_utilisation(provenance.get(WORKER_BUSY_KEY), makespan),
        **_wait_shares(done, latency),
        "backlog_slope_rps": backlog_slope_rps(arrival, finish),
        "max_worker_share": _max_worker_share(records["worker"].to_numpy()),
    }
    out = {k: (float(f"{v:.12g}") if isinstance(v, float) else v) for k, v in out.items()}
    window = float(arrival.max() - arrival.min()) if n_done > 1 else 0.0
    rate = (n_done - 1) / window if window > 0 else math.nan
    out["regime"] = load_regime(out["backlog_slope_rps"], rate, out["wait_share_p50"], out["util_max"])
    out["provenance"] = provenance
    return out


def _utilisation(busy_s, makespan: float) -> dict:
    """Per-worker busy seconds / makespan: mean and max over the workers (NaN when not measured)."""
    if busy_s is None or not len(busy_s) or not makespan > 0:
        return {"util_mean": math.nan, "util_max": math.nan}
    util = np.asarray(busy_s, dtype=float) / makespan
    return {"util_mean": float(util.mean()), "util_max": float(util.max())}


def _wait_shares(done: pd.DataFrame, latency: np.ndarray) -> dict:
    """P50 / P95 of queue wait / latency over completed requests whose queue wait is known."""
    wait = done["queue_wait_s"].to_numpy(dtype=float) if "queue_wait_s" in done else np.full(len(done), math.nan)
    ok = np.isfinite(wait) & (latency > 0)
    share = wait[ok] / latency[ok]
    return {"wait_share_p50": _pct(share, 50), "wait_share_p95": _pct(share, 95)}


def _max_worker_share(worker: np.ndarray) -> float:
    """The largest fraction of the requests (with a known worker, id >= 0) that one worker got."""
    known = worker[worker >= 0].astype(np.int64)
    return float(np.bincount(known).max() / len(known)) if len(known) else math.nan


def warmup_requests(provenance: dict | None) -> int:
    """How many of the first record ids were the client's warm-up (0 without a client)."""
    client = ((provenance or {}).get("workload") or {}).get("client") or {}
    return int(client.get("warmup_requests") or 0)


def _summarize_artifact(records: pd.DataFrame, provenance: dict | None) -> dict:
    """The scripts' definitions: today's on the timed requests, the hit rate over all of them."""
    prov = dict(provenance or {})
    k = warmup_requests(prov)
    timed = records[records["id"].to_numpy() >= k]
    prov["metric_definition"] = "artifact"
    out = summarize(timed, prov)
    failed = records["failed"].to_numpy(dtype=bool) if "failed" in records else np.zeros(len(records), bool)
    served = records[~failed]
    prompt = int(served["prompt_tokens"].sum())
    hit = int(served["cached_tokens"].sum()) / prompt if prompt else math.nan
    out["hit_rate"] = float(f"{hit:.12g}") if isinstance(hit, float) else hit
    out["num_requests"] = int(len(records))
    out["num_failed"] = int(failed.sum())
    return out
