"""The summary's load-regime fields (ALGORITHMS.md §5 "Load regime") on traces built by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.metrics import RECORD_COLUMNS, WORKER_BUSY_KEY, summarize
from repro.metrics.summary import backlog_slope_rps


def fifo_trace(arrival: np.ndarray, service_s: float) -> tuple[pd.DataFrame, float]:
    """One FIFO server (Lindley's recursion), each request prefilled for 40 % of service_s and
    decoded for the rest; its records and busy seconds."""
    start = np.empty_like(arrival)
    free = -math.inf
    for k, a in enumerate(arrival):
        start[k] = max(a, free)
        free = start[k] + service_s
    first = start + 0.4 * service_s
    finish = start + service_s
    n = len(arrival)
    df = pd.DataFrame({
        "id": np.arange(n), "worker": np.zeros(n, dtype=np.int64), "arrival_s": arrival, "first_token_s": first,
        "finish_s": finish, "queue_wait_s": start - arrival, "prefill_s": first - start, "decode_s": finish - first,
        "prompt_tokens": 10, "cached_tokens": 0, "output_tokens": 4, "group": 0, "failed": False,
    }, columns=list(RECORD_COLUMNS))
    return df, n * service_s


def test_hand_computed_regime_fields():
    # two workers; worker 0 serves 0 and 2, worker 1 serves 1; request 3 failed (no finish)
    rows = [
        dict(arrival_s=0.0, first_token_s=1.0, finish_s=2.0, queue_wait_s=0.5, worker=0),  # share 0.25
        dict(arrival_s=1.0, first_token_s=1.5, finish_s=2.0, queue_wait_s=0.0, worker=1),  # share 0
        dict(arrival_s=2.0, first_token_s=5.0, finish_s=6.0, queue_wait_s=3.0, worker=0),  # share 0.75
        dict(arrival_s=3.0, first_token_s=math.nan, finish_s=math.nan, queue_wait_s=math.nan, worker=0, failed=True),
    ]
    for i, r in enumerate(rows):
        r.update(id=i, prefill_s=math.nan, decode_s=r["finish_s"] - r["first_token_s"], prompt_tokens=10,
                 cached_tokens=0, output_tokens=1, group=0, failed=r.get("failed", False))
    s = summarize(pd.DataFrame(rows, columns=list(RECORD_COLUMNS)), {WORKER_BUSY_KEY: [4.5, 1.5]})
    assert s["makespan_s"] == 6.0
    assert s["util_max"] == 0.75 and s["util_mean"] == 0.5  # 4.5 / 6, (4.5 + 1.5) / 2 / 6
    assert s["wait_share_p50"] == 0.25 and s["wait_share_p95"] == pytest.approx(0.25 + 0.9 * 0.5)
    assert s["max_worker_share"] == 0.75  # worker 0 got 3 of the 4 requests
    # backlog just after the completed arrivals t = 0, 1, 2: 1, 2, 1 (two finished at 2) -> slope 0
    assert s["backlog_slope_rps"] == 0.0
    assert s["regime"] == "stable"


def test_backlog_slope_of_a_steady_climb():
    # one arrival per second, nothing finishes: the backlog after arrival k is k + 1
    arrival = np.arange(10.0)
    assert backlog_slope_rps(arrival, np.full(10, 100.0)) == pytest.approx(1.0)
    assert math.isnan(backlog_slope_rps(np.zeros(3), np.ones(3)))  # no arrival window


def test_overloaded_fifo_server():
    # 10 req/s into a server of 5 req/s: the backlog grows at ~5 req/s
    df, busy = fifo_trace(np.arange(1000) * 0.1, 0.2)
    s = summarize(df, {WORKER_BUSY_KEY: [busy]})
    assert s["backlog_slope_rps"] == pytest.approx(5.0, rel=0.01)
    assert s["regime"] == "overloaded" and s["util_max"] == pytest.approx(1.0, rel=0.01)


def test_light_fifo_server():
    rng = np.random.default_rng(0)
    df, busy = fifo_trace(np.cumsum(rng.exponential(0.1, 2000)), 0.01)  # utilisation ~0.1
    s = summarize(df, {WORKER_BUSY_KEY: [busy]})
    assert abs(s["backlog_slope_rps"]) < 0.01 and s["wait_share_p50"] == 0.0
    assert s["util_max"] == pytest.approx(0.1, rel=0.1) and s["regime"] == "stable"


def test_busy_but_not_growing_is_backlogged():
    # deterministic arrivals, utilisation 0.95: never a queue, but the worker is almost always busy
    df, busy = fifo_trace(np.arange(500) * 0.1, 0.095)
    s = summarize(df, {WORKER_BUSY_KEY: [busy]})
    assert abs(s["backlog_slope_rps"]) < 0.01 and s["util_max"] >= 0.9 and s["regime"] == "backlogged"
    s = summarize(df)  # without busy times (a live backend) nothing shows the backlog
    assert math.isnan(s["util_max"]) and s["regime"] == "stable"


@settings(max_examples=40, deadline=None)
@given(st.integers(50, 400), st.floats(0.01, 1.0), st.floats(0.01, 0.45) | st.floats(1.5, 4.0))
def test_regime_of_deterministic_fifo(n, gap_s, load):
    """Arrivals every gap_s, service load x gap_s: overloaded from 1.5 on (the backlog grows at
    (1 - 1 / load) of the arrival rate >= 1/3), stable below 0.45 (no wait, utilisation < 0.9)."""
    df, busy = fifo_trace(np.arange(n) * gap_s, load * gap_s)
    s = summarize(df, {WORKER_BUSY_KEY: [busy]})
    assert s["regime"] == ("overloaded" if load >= 1.5 else "stable"), s
    if load < 1:
        assert s["backlog_slope_rps"] == 0.0
    else:
        assert s["backlog_slope_rps"] > 0
