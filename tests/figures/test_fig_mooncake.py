"""mooncake_replay's figure: the bars row plus per-window P95 latency/TTFT read from requests.parquet."""

from __future__ import annotations

import numpy as np
import pandas as pd

from repro.figures import mooncake_replay
from repro.figures.load import load_cells


def test_over_time_is_the_p95_per_window_of_each_system(fixture_results, rendered):
    rc, figures, _ = rendered
    assert rc == 0
    for f in ("mooncake_replay.png", "mooncake_replay.csv", "mooncake_replay_over_time.csv"):
        assert (figures / f).is_file()
    ts = mooncake_replay.over_time(fixture_results, load_cells(fixture_results, "mooncake_replay"))
    assert ts["policy_name"].nunique() == 6
    one = ts[ts["policy_name"] == "LBGR+RLT"].sort_values("window")
    cell = sorted((fixture_results / "mooncake_replay").iterdir())
    # reference: recompute window 0 of the LBGR+RLT cell by hand
    for d in cell:
        if "LBGR+RLT" in (d / "config.yaml").read_text():
            r = pd.read_parquet(d / "requests.parquet")
            w0 = r[r["arrival_s"] < mooncake_replay.WINDOW_S]
            want = np.quantile(w0["finish_s"] - w0["arrival_s"], 0.95)
            assert abs(one["latency_s"].iloc[0] - want) < 1e-12
            assert one["requests"].iloc[0] == len(w0)
            break
    else:
        raise AssertionError("no LBGR+RLT cell in the fixture")
