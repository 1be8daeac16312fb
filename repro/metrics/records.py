"""The per-request record format every backend returns and requests.parquet stores."""

from __future__ import annotations

# Columns of requests.parquet, in order (ARCHITECTURE.md "Result files"). Failed requests:
# failed=True, times NaN.
RECORD_COLUMNS: tuple[str, ...] = (
    "id",
    "worker",
    "arrival_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "group",
    "failed",
)
