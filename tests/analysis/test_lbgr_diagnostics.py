"""The LBGR diagnostics wrapper records decisions without changing them."""

from __future__ import annotations

import numpy as np
import pytest
from small_gsp import SMALL_GSP

from repro.analysis.cells import compose_cell
from repro.analysis.decisions import run_instrumented, summarise_decisions

SMALL = [
    *SMALL_GSP,
    "cluster.kv_cache_tokens=1500",
    "workload.request_rate=40.0",
    "tracking=disabled",
]


@pytest.mark.parametrize("policy", ["lbgr_lru", "cache_aware_lru"])
def test_instrumented_run_equals_the_harness_run(policy):
    from repro.backends.sim import run_cell
    from repro.metrics.summary import summarize

    cfg = compose_cell([f"policy={policy}", *SMALL])
    summary, rec = run_instrumented(cfg)
    harness = run_cell(compose_cell([f"policy={policy}", *SMALL]))
    plain = summarize(harness.records, harness.provenance)
    summary.pop("provenance", None)
    plain.pop("provenance", None)
    assert summary == plain
    d = rec.decision_table()
    assert len(d) == 96 and d["latency_s"].notna().all()
    diag = summarise_decisions(d, 4)
    assert diag["decisions"] == 96
    assert diag["hit_served"] == pytest.approx(summary["hit_rate"])
    if policy == "lbgr_lru":
        # E = S + P + r per worker, and the recorded tracker hit is what LBGR saw
        for i in range(4):
            np.testing.assert_allclose(
                d[f"predicted_s_w{i}"], d[f"service_s_w{i}"] + d[f"load_s_w{i}"] + d[f"residual_s_w{i}"]
            )
        assert len(rec.theta_table()) == 96
    else:
        assert np.isnan(d["predicted_s_chosen"]).all()
