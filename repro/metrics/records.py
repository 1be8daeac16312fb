"""The per-request record format every backend returns and requests.parquet stores."""

from __future__ import annotations

# Columns of requests.parquet, in order (ARCHITECTURE.md "Result files"). Failed requests:
# failed=True, times NaN. The latency's parts (ALGORITHMS.md §5): queue_wait_s = arrival -> the
# start of the request's first prefill step on its worker, prefill_s = that start -> first token
# (chunked rounds included), decode_s = first token -> finish; their sum is finish - arrival (up to
# float rounding). Backends that cannot see the queue's end (the live client) write NaN for the
# first two.
RECORD_COLUMNS: tuple[str, ...] = (
    "id",
    "worker",
    "arrival_s",
    "first_token_s",
    "finish_s",
    "queue_wait_s",
    "prefill_s",
    "decode_s",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "group",
    "failed",
)
