"""Per-request records -> run summary (SGLang bench definitions, ALGORITHMS.md §5).

`RECORD_COLUMNS`: the record format of every backend (requests.parquet). Never imports wandb or
matplotlib.
"""

from repro.metrics.records import RECORD_COLUMNS
from repro.metrics.summary import (
    METRIC_DEFINITIONS,
    REGIMES,
    SUMMARY_KEYS,
    TEXT_SUMMARY_KEYS,
    WORKER_BUSY_KEY,
    summarize,
)

__all__ = [
    "METRIC_DEFINITIONS",
    "RECORD_COLUMNS",
    "REGIMES",
    "SUMMARY_KEYS",
    "TEXT_SUMMARY_KEYS",
    "WORKER_BUSY_KEY",
    "summarize",
]
