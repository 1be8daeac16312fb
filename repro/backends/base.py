"""The contract every backend (sim, sglang) fulfils for one grid cell."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass
class CellResult:
    """What a backend returns for one cell: per-request records + provenance + wall-clock timings.

    `records` has RECORD_COLUMNS (failed requests: failed=True, times NaN).
    `provenance` goes into summary.json; `timings` (wall-clock, machine-dependent) into
    timings.json and never into a result's identity. `samples` (optional): backend-side state
    over time for the cell's time series (repro.tracking.series), e.g. StateSampler.as_dict().
    """

    records: pd.DataFrame
    provenance: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    samples: dict | None = None
