"""The benchmark client: open-loop replay, the simulator's record columns, failures as rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from repro.metrics import RECORD_COLUMNS
from repro.backends.sglang.client import ClientConfig, replay
from repro.metrics.summary import summarize

from live_helpers import FakeWorker, make_requests, need_parts, run_async, sglang_events


@pytest.fixture(autouse=True)
def _parts():
    need_parts()


def _replay_against(behaviour, requests, **cfg):
    async def main():
        w = FakeWorker(behaviour)
        await w.start()
        try:
            return await replay(requests, w.url, ClientConfig(**cfg)), w.bodies
        finally:
            await w.stop()

    return run_async(main(), 60)


def test_records_have_the_simulators_columns_and_dtypes():
    reqs = make_requests(12, prompt_len=30, output_len=3, rate=200.0, text=True)
    (records, report), bodies = _replay_against(lambda b: sglang_events(b, cached=7), reqs, time_scale=2.0,
                                                send_reference_output=True)
    assert list(records.columns) == list(RECORD_COLUMNS)
    expected = {"id": "int64", "worker": "int64", "arrival_s": "float64", "first_token_s": "float64",
                "finish_s": "float64", "queue_wait_s": "float64", "prefill_s": "float64", "decode_s": "float64",
                "prompt_tokens": "int64", "cached_tokens": "int64",
                "output_tokens": "int64", "group": "int64", "failed": "bool"}
    assert {c: str(records[c].dtype) for c in records.columns} == expected
    assert records["id"].tolist() == [r.id for r in reqs]
    assert (records["worker"] == -1).all()  # no X-Repro-Worker header from a bare worker
    assert (records["cached_tokens"] == 7).all() and (records["output_tokens"] == 3).all()
    assert (records["prompt_tokens"] == 30).all() and not records["failed"].any()
    assert (records["arrival_s"] <= records["first_token_s"]).all()
    assert (records["first_token_s"] <= records["finish_s"]).all()
    # the client cannot see the queue's end: no queue wait / prefill split, decode = finish - first token
    assert records["queue_wait_s"].isna().all() and records["prefill_s"].isna().all()
    assert (records["decode_s"] == records["finish_s"] - records["first_token_s"]).all()
    # what went over the wire: exact ids, output length, reference reply, text
    by_rid = {b["rid"]: b for b in bodies}
    for r in reqs:
        b = by_rid[f"repro-{r.id}"]
        assert b["input_ids"] == r.prompt_tokens.tolist() and b["text"] == r.text
        assert b["sampling_params"]["max_new_tokens"] == r.output_len and b["sampling_params"]["ignore_eos"]
        assert b["custom_labels"]["repro_output_ids"] == ",".join(map(str, r.generated_tokens.tolist()))
    assert report["num_failed"] == 0 and report["time_scale"] == 2.0


def test_a_servers_queue_time_splits_the_ttft():
    """SGLang with --enable-metrics puts meta_info.queue_time (seconds) on the final event."""
    def with_queue_time(body):
        events = sglang_events(body)
        events[-2]["meta_info"]["queue_time"] = 0.004
        return events

    reqs = make_requests(4, prompt_len=20, output_len=2, rate=100.0)
    (records, _), _ = _replay_against(with_queue_time, reqs, time_scale=2.0)
    assert (records["queue_wait_s"] == 0.008).all()  # x time_scale, like every time of the record
    ttft = records["first_token_s"] - records["arrival_s"]
    assert np.allclose(records["queue_wait_s"] + records["prefill_s"], ttft, rtol=0, atol=1e-12)


def test_open_loop_sends_at_the_arrival_times_never_early():
    reqs = make_requests(30, prompt_len=10, output_len=2, rate=100.0)
    (records, report), _ = _replay_against(lambda b: sglang_events(b), reqs, time_scale=1.0)
    sent = records["arrival_s"].to_numpy()
    planned = np.array([r.arrival_s for r in reqs])
    assert np.all(sent >= planned - 1e-3)  # never before its arrival time
    lag = sent - planned
    assert report["send_lag_s"]["max"] == pytest.approx(lag.max(), abs=1e-6)
    assert np.all(np.diff(sent) >= -1e-3)


@pytest.mark.parametrize(
    "behaviour, kind",
    [
        (lambda b: ("status", 500, "boom"), "http_status"),
        (lambda b: [sglang_events(b)[0], b"data: {bad\n\n"], "malformed"),
        (lambda b: [sglang_events(b)[0]], "malformed"),  # stream ends without a finish / [DONE]
        (lambda b: [{"error": {"message": "worker says no"}}, b"data: [DONE]\n\n"], "server_error"),
        (lambda b: "hang", "timeout"),
    ],
)
def test_failures_become_failed_rows(behaviour, kind):
    reqs = make_requests(3, prompt_len=10, output_len=2, rate=100.0)
    (records, report), _ = _replay_against(behaviour, reqs, request_timeout_s=0.5)
    assert records["failed"].all()
    assert records[["first_token_s", "finish_s"]].isna().all().all()
    assert (records["cached_tokens"] == 0).all() and (records["output_tokens"] == 0).all()
    assert (records["prompt_tokens"] == 10).all() and records["arrival_s"].notna().all()
    assert report["failures"] == {kind: 3} and len(report["failure_examples"]) == 3
    summary = summarize(records)
    assert summary["num_failed"] == 3 and summary["num_requests"] == 3 and math.isnan(summary["hit_rate"])


def test_connection_refused_and_bad_input():
    reqs = make_requests(2, prompt_len=5, output_len=1, rate=100.0)
    records, report = run_async(replay(reqs, "http://127.0.0.1:9", ClientConfig(connect_timeout_s=1.0)), 30)
    assert records["failed"].all() and report["failures"] == {"connection": 2}
    with pytest.raises(ValueError, match="no requests"):
        run_async(replay([], "http://127.0.0.1:9", ClientConfig()))
    with pytest.raises(ValueError, match="sorted"):
        run_async(replay(list(reversed(make_requests(3))), "http://127.0.0.1:9", ClientConfig()))
    with pytest.raises(ValueError, match="time_scale"):
        ClientConfig(time_scale=0)


def test_summary_of_mixed_records_counts_only_completed_requests():
    reqs = make_requests(10, prompt_len=20, output_len=2, rate=200.0)
    flaky = {"n": 0}

    def behaviour(body):
        flaky["n"] += 1
        return ("status", 503, "busy") if flaky["n"] % 3 == 0 else sglang_events(body, cached=10)

    (records, _), _ = _replay_against(behaviour, reqs)
    summary = summarize(records)
    n_failed = int(records["failed"].sum())
    assert n_failed == 3 and summary["num_failed"] == 3
    assert summary["hit_rate"] == pytest.approx(0.5)  # 10 of 20 prompt tokens, completed requests only
    assert isinstance(records, pd.DataFrame)


def test_live_window_streams_the_series_keys_while_the_cell_runs():
    """progress.log gets sliding-window points as requests finish (what a live W&B dashboard shows)."""
    from repro.tracking import Progress

    fractions, points = [], []
    progress = Progress(fractions.append, points.append)
    reqs = make_requests(40, prompt_len=20, output_len=2, rate=400.0)

    async def main():
        w = FakeWorker(lambda b: sglang_events(b, cached=5))
        await w.start()
        try:
            return await replay(reqs, w.url, ClientConfig(), progress)
        finally:
            await w.stop()

    records, _ = run_async(main(), 60)
    assert fractions[-1] == 1.0 and points, "no live point logged"
    last = points[-1]
    assert last["completed"] == 40  # the last completion always logs
    assert last["window/hit_rate"] == pytest.approx(5 / 20)
    lat = (records["finish_s"] - records["arrival_s"]).to_numpy()
    assert last["window/latency_p95_s"] == pytest.approx(np.percentile(lat, 95))  # all 40 within 10 s
    assert {"window/completed_rps", "window/ttft_p50_s", "window/ttft_p95_s", "window/latency_p50_s"} <= set(last)
    assert [p["completed"] for p in points] == sorted(p["completed"] for p in points)
