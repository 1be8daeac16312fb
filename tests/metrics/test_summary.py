"""repro.metrics.summarize — the headline numbers — against a plain-Python reference."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.metrics import RECORD_COLUMNS
from repro.metrics import SUMMARY_KEYS, summarize


def ref_percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), written out."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ref_backlog_slope(done: list[dict]) -> float:
    """Least squares, written out, of (arrived - finished) read just after each arrival."""
    ts = sorted(r["arrival_s"] for r in done)
    if len(ts) < 2 or ts[-1] <= ts[0]:
        return math.nan
    backlog = [sum(a <= t for a in ts) - sum(r["finish_s"] <= t for r in done) for t in ts]
    tm, bm = sum(ts) / len(ts), sum(backlog) / len(backlog)
    return sum((t - tm) * (b - bm) for t, b in zip(ts, backlog)) / sum((t - tm) ** 2 for t in ts)


def reference(rows: list[dict]) -> dict:
    done = [r for r in rows if not r["failed"]]
    shares = [r["queue_wait_s"] / (r["finish_s"] - r["arrival_s"]) for r in done
              if not math.isnan(r.get("queue_wait_s", math.nan)) and r["finish_s"] > r["arrival_s"]]
    workers = [r["worker"] for r in rows if r["worker"] >= 0]
    lat = [r["finish_s"] - r["arrival_s"] for r in done]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in done]
    prompt = sum(r["prompt_tokens"] for r in done)
    cached = sum(r["cached_tokens"] for r in done)
    out_tok = sum(r["output_tokens"] for r in done)
    makespan = max(r["finish_s"] for r in done) - min(r["arrival_s"] for r in rows) if done else math.nan
    ok = bool(done) and makespan > 0
    return {
        "num_requests": len(rows),
        "num_failed": len(rows) - len(done),
        "hit_rate": cached / prompt if prompt else math.nan,
        "throughput_rps": len(done) / makespan if ok else math.nan,
        "throughput_tok_s": (prompt + out_tok) / makespan if ok else math.nan,
        "latency_p50_s": ref_percentile(lat, 50),
        "latency_p95_s": ref_percentile(lat, 95),
        "ttft_p50_s": ref_percentile(ttft, 50),
        "ttft_p95_s": ref_percentile(ttft, 95),
        "makespan_s": makespan,
        "util_mean": math.nan,  # no busy times in the provenance
        "util_max": math.nan,
        "wait_share_p50": ref_percentile(shares, 50),
        "wait_share_p95": ref_percentile(shares, 95),
        "backlog_slope_rps": ref_backlog_slope(done),
        "max_worker_share": max(workers.count(w) for w in set(workers)) / len(workers) if workers else math.nan,
    }


def ref_regime(s: dict, done: list[dict]) -> str | None:
    """ALGORITHMS.md §5 "Load regime", restated."""
    ts = [r["arrival_s"] for r in done]
    if math.isnan(s["backlog_slope_rps"]):
        return None
    rate = (len(ts) - 1) / (max(ts) - min(ts))
    if s["backlog_slope_rps"] >= 0.04 * rate:
        return "overloaded"
    if s["wait_share_p50"] >= 0.5 or s["util_max"] >= 0.9:
        return "backlogged"
    return "stable"


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def close(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == pytest.approx(b, rel=1e-9, abs=1e-12)


row = st.builds(
    lambda arrival, ttft, decode, prompt, frac, out, failed, wait: {
        "arrival_s": arrival, "first_token_s": arrival + ttft, "finish_s": arrival + ttft + decode,
        "prompt_tokens": prompt, "cached_tokens": int(prompt * frac), "output_tokens": out, "failed": failed,
        "queue_wait_s": math.nan if wait is None else ttft * wait, "prefill_s": math.nan, "decode_s": decode,
    },
    st.integers(0, 10_000).map(lambda c: c / 100),  # centiseconds: no ill-conditioned backlog fits
    st.floats(0, 5), st.floats(0, 5), st.integers(1, 4000), st.floats(0, 1),
    st.integers(1, 64), st.booleans(), st.none() | st.floats(0, 1),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(row, min_size=1, max_size=40))
def test_summary_matches_the_reference(rows):
    for i, r in enumerate(rows):
        r.update(id=i, worker=i % 3, group=i % 2)
    got = summarize(frame(rows), {"x": 1})
    want = reference(rows)
    assert list(got) == [*SUMMARY_KEYS, "provenance"] and got["provenance"] == {"x": 1}
    for k in SUMMARY_KEYS:
        if k != "regime":
            assert close(got[k], want[k]), (k, got[k], want[k])
    assert got["regime"] == ref_regime(got, [r for r in rows if not r["failed"]])


def test_hand_computed_example():
    rows = [
        dict(id=0, worker=0, arrival_s=0.0, first_token_s=0.5, finish_s=1.0, prompt_tokens=100, cached_tokens=0,
             output_tokens=4, group=0, failed=False),
        dict(id=1, worker=1, arrival_s=1.0, first_token_s=1.25, finish_s=3.0, prompt_tokens=100, cached_tokens=50,
             output_tokens=4, group=0, failed=False),
        dict(id=2, worker=0, arrival_s=2.0, first_token_s=9.0, finish_s=9.0, prompt_tokens=300, cached_tokens=300,
             output_tokens=0, group=1, failed=True),  # failed: counted in num_failed only
    ]
    s = summarize(frame(rows))
    assert s["num_requests"] == 3 and s["num_failed"] == 1
    assert s["hit_rate"] == 0.25  # 50 / 200 over completed requests
    assert s["makespan_s"] == 3.0 and s["throughput_rps"] == pytest.approx(2 / 3)
    assert s["throughput_tok_s"] == pytest.approx(208 / 3)
    assert s["latency_p50_s"] == 1.5 and s["ttft_p50_s"] == 0.375
    assert s["latency_p95_s"] == pytest.approx(1.0 + 0.95 * 1.0)


def test_all_failed_gives_nan_not_an_error():
    rows = [dict(id=0, worker=0, arrival_s=0.0, first_token_s=0.0, finish_s=0.0, prompt_tokens=5, cached_tokens=0,
                 output_tokens=0, group=0, failed=True)]
    s = summarize(frame(rows))
    assert s["num_failed"] == 1 and all(math.isnan(s[k]) for k in ("hit_rate", "throughput_rps", "latency_p50_s"))


def test_same_records_same_bytes_whatever_the_row_order():
    import json

    rng = np.random.default_rng(0)
    n = 200
    arr = np.sort(rng.uniform(0, 50, n))
    df = pd.DataFrame({"id": np.arange(n), "worker": rng.integers(0, 4, n), "arrival_s": arr,
                       "first_token_s": arr + rng.uniform(0, 1, n), "finish_s": arr + 1 + rng.uniform(0, 2, n),
                       "prompt_tokens": rng.integers(1, 500, n), "cached_tokens": 0, "output_tokens": 4,
                       "group": 0, "failed": False}, columns=list(RECORD_COLUMNS))
    df["cached_tokens"] = df["prompt_tokens"] // 3
    a = json.dumps(summarize(df), sort_keys=True)
    b = json.dumps(summarize(df.sample(frac=1.0, random_state=1)), sort_keys=True)
    assert a == b
