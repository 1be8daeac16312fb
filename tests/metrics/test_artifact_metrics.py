"""The artifact metric definitions (summarize(definition="artifact")) on hand-made records."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from repro.metrics import RECORD_COLUMNS, summarize


def records(rows):
    """rows: (arrival, first token, finish, prompt, cached, failed)."""
    df = pd.DataFrame(
        {
            "id": np.arange(len(rows)),
            "worker": np.arange(len(rows)) % 2,
            "arrival_s": [r[0] for r in rows],
            "first_token_s": [r[1] for r in rows],
            "finish_s": [r[2] for r in rows],
            "queue_wait_s": [0.0] * len(rows),
            "prefill_s": [r[1] - r[0] for r in rows],
            "decode_s": [r[2] - r[1] for r in rows],
            "prompt_tokens": [r[3] for r in rows],
            "cached_tokens": [r[4] for r in rows],
            "output_tokens": [4] * len(rows),
            "group": [0] * len(rows),
            "failed": [r[5] for r in rows],
        }
    )
    return df[list(RECORD_COLUMNS)]


ROWS = [
    (0.0, 0.5, 0.6, 100, 0, False),  # warm-up
    (1.6, 1.8, 2.0, 100, 99, False),
    (2.0, 3.0, 4.0, 300, 0, False),
    (2.5, 2.6, 3.1, 200, 150, False),
    (3.0, math.nan, math.nan, 50, 0, True),
]
PROV = {"workload": {"client": {"client": "warmup_then_open_loop", "warmup_requests": 1}}}


def test_artifact_definitions_by_hand():
    s = summarize(records(ROWS), PROV, definition="artifact")
    timed = [(1.6, 1.8, 2.0), (2.0, 3.0, 4.0), (2.5, 2.6, 3.1)]
    assert s["latency_p50_s"] == pytest.approx(np.median([f - a for a, _, f in timed]))
    assert s["ttft_p50_s"] == pytest.approx(np.median([t - a for a, t, _ in timed]))
    assert s["throughput_rps"] == pytest.approx(3 / (4.0 - 1.6))  # first timed send -> last completion
    assert s["hit_rate"] == pytest.approx((0 + 99 + 0 + 150) / (100 + 100 + 300 + 200))  # warm-up included
    assert s["num_requests"] == 5 and s["num_failed"] == 1
    assert s["provenance"]["metric_definition"] == "artifact"


def test_text_definition_is_unchanged_and_differs_here():
    t = summarize(records(ROWS), PROV)
    assert json.dumps(t, sort_keys=True) == json.dumps(
        summarize(records(ROWS), PROV, definition="text"), sort_keys=True
    )
    assert t["hit_rate"] == pytest.approx(249 / 700) and t["throughput_rps"] == pytest.approx(4 / 4.0)
    assert "metric_definition" not in t["provenance"]


def test_without_a_client_the_artifact_hit_rate_is_todays_and_bad_names_fail():
    rows = [r for r in ROWS if not r[5]]
    a = summarize(records(rows), {}, definition="artifact")
    t = summarize(records(rows), {})
    assert a["hit_rate"] == t["hit_rate"] and a["latency_p50_s"] == t["latency_p50_s"]
    with pytest.raises(ValueError, match="metric definition"):
        summarize(records(rows), {}, definition="paper")
