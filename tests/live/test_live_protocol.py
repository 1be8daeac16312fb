"""The /generate wire format: request validation, SSE parsing, folding events into totals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.backends.sglang import protocol
from repro.backends.sglang.protocol import OutputTracker, ProtocolError, WorkerReportedError


def test_generate_body_round_trips_through_the_parser():
    body = protocol.generate_body(np.array([5, 6, 7], dtype=np.int32), 4, rid="r1",
                                  reference_output_ids=[9, 8, 7, 6], text="hello\n")
    assert body["sampling_params"] == {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}
    assert body["stream"] is True
    inp = protocol.parse_generate_request(json.loads(json.dumps(body)))
    assert inp.input_ids.dtype == np.int32 and inp.input_ids.tolist() == [5, 6, 7]
    assert inp.max_new_tokens == 4 and inp.stream and inp.rid == "r1" and inp.text == "hello\n"
    assert inp.reference_output_ids.tolist() == [9, 8, 7, 6]


def test_defaults_follow_sglang():
    inp = protocol.parse_generate_request({"text": "hi"})
    assert inp.max_new_tokens == protocol.DEFAULT_MAX_NEW_TOKENS == 128
    assert inp.stream is False and inp.input_ids is None and inp.reference_output_ids is None


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([1, 2], "JSON object"),
        ({}, "'text' or 'input_ids'"),
        ({"input_ids": []}, "empty"),
        ({"input_ids": [[1, 2], [3]]}, "batched"),
        ({"text": ["a", "b"]}, "batched"),
        ({"text": ""}, "non-empty"),
        ({"input_ids": [1, "x"]}, "integers"),
        ({"input_ids": [1, 2.5]}, "integers"),
        ({"input_ids": [1, -3]}, "outside"),
        ({"input_ids": [1, 2**40]}, "outside"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "4"}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": [1]}, "sampling_params"),
        ({"input_ids": [1], "stream": "yes"}, "stream"),
        ({"input_ids": [1], "rid": 5}, "rid"),
        ({"input_ids": [1], "custom_labels": {protocol.OUTPUT_IDS_KEY: "abc"}}, protocol.OUTPUT_IDS_KEY),
        ({"input_ids": [1], "custom_labels": {protocol.OUTPUT_IDS_KEY: "1,,2"}}, protocol.OUTPUT_IDS_KEY),
        ({"input_ids": [1], "custom_labels": {protocol.OUTPUT_IDS_KEY: [1, 2]}}, protocol.OUTPUT_IDS_KEY),
        ({"input_ids": [1], "custom_labels": "x"}, "custom_labels"),
    ],
)
def test_bad_requests_are_named(body, fragment):
    with pytest.raises(ProtocolError, match=fragment.replace("[", r"\[")):
        protocol.parse_generate_request(body)


def _meta(k, n, cached=3, prompt=10):
    return {"id": "a", "finish_reason": {"type": "length", "length": n} if k == n else None,
            "prompt_tokens": prompt, "completion_tokens": k, "cached_tokens": cached}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 128_000), min_size=1, max_size=20))
def test_cumulative_and_incremental_streams_give_the_same_reply(ids):
    n = len(ids)
    cum, inc = OutputTracker(), OutputTracker()
    new_cum = [cum.add({"output_ids": ids[:k], "meta_info": _meta(k, n)}) for k in range(1, n + 1)]
    new_inc = [inc.add({"output_ids": ids[k - 1:k], "meta_info": _meta(k, n)}) for k in range(1, n + 1)]
    assert cum.output_ids == inc.output_ids == ids
    assert new_cum == new_inc == [1] * n
    assert cum.finished and inc.finished and cum.completion_tokens == n and cum.cached_tokens == 3


def test_stream_interval_events_count_several_tokens():
    t = OutputTracker()
    assert t.add({"output_ids": [1, 2, 3], "meta_info": _meta(3, 5)}) == 3
    assert t.add({"output_ids": [1, 2, 3, 4, 5], "meta_info": _meta(5, 5)}) == 2
    assert t.finished and t.output_ids == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "event, exc, fragment",
    [
        ("text", ProtocolError, "JSON object"),
        ({"text": "x"}, ProtocolError, "meta_info"),
        ({"meta_info": {"completion_tokens": 1, "prompt_tokens": 2}}, ProtocolError, "cached_tokens"),
        ({"meta_info": {"completion_tokens": -1, "prompt_tokens": 2, "cached_tokens": 0}}, ProtocolError,
         "completion_tokens"),
        ({"output_ids": "x", "meta_info": _meta(1, 2)}, ProtocolError, "output_ids"),
        ({"error": {"message": "boom", "code": 500}}, WorkerReportedError, "boom"),
    ],
)
def test_malformed_and_error_events(event, exc, fragment):
    with pytest.raises(exc, match=fragment):
        OutputTracker().add(event)


def test_completion_tokens_never_go_backwards():
    t = OutputTracker()
    t.add({"meta_info": _meta(2, 4)})
    with pytest.raises(ProtocolError, match="backwards"):
        t.add({"meta_info": _meta(1, 4)})


def test_sse_lines():
    assert protocol.parse_sse_line(b"data: [DONE]\n") is protocol.DONE
    assert protocol.parse_sse_line(b"data: {\"a\": 1}\n") == {"a": 1}
    assert protocol.parse_sse_line(b"\n") is None
    assert protocol.parse_sse_line(b": keep-alive\n") is None
    with pytest.raises(ProtocolError, match="malformed event line"):
        protocol.parse_sse_line(b"event: x\n")
    with pytest.raises(ProtocolError, match="not JSON"):
        protocol.parse_sse_line(b"data: {oops\n")


def test_error_event_is_what_sglang_sends():
    raw = protocol.finish_event_error("down", 502, "bad_gateway")
    events = [protocol.parse_sse_line(line) for line in raw.split(b"\n") if line]
    assert events[-1] is protocol.DONE
    with pytest.raises(WorkerReportedError, match="down"):
        OutputTracker().add(events[0])
