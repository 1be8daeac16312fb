"""Per-request records -> run summary (SGLang bench definitions, ALGORITHMS.md §5).

Never imports wandb or matplotlib.
"""

from repro.metrics.summary import SUMMARY_KEYS, summarize

__all__ = ["SUMMARY_KEYS", "summarize"]
