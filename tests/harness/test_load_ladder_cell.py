"""Two cells of the load ladder (conf/exp/load_ladder.yaml, shrunk to 256 queries) through the
harness: the light one is stable, the one at the ladder's top overloaded, and the records take
every latency apart."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import yaml

from tests.harness.helpers import run_inprocess


def test_ladder_ends_run_and_carry_their_regime(tmp_path, monkeypatch):
    rc = run_inprocess(tmp_path, "+exp=load_ladder", "tracking=disabled", "n_jobs=1", "workload=gsp",
                       "workload.request_rate=4.0,96.0", "policy=random_lru", "workload.num_queries=256",
                       "exp_name=load_ladder",  # an override run would go to a folder of its own
                       monkeypatch=monkeypatch)
    assert rc == 0
    by_rate = {}
    for cell in sorted((tmp_path / "load_ladder").iterdir()):
        rate = yaml.safe_load((cell / "config.yaml").read_text())["workload"]["request_rate"]
        by_rate[rate] = json.loads((cell / "summary.json").read_text())
        records = pd.read_parquet(cell / "requests.parquet")
        parts = records[["queue_wait_s", "prefill_s", "decode_s"]].sum(axis=1).to_numpy()
        assert np.allclose(parts, (records["finish_s"] - records["arrival_s"]).to_numpy(), rtol=1e-12, atol=1e-12)
    light, heavy = by_rate[4.0], by_rate[96.0]
    assert light["regime"] == "stable" and light["util_max"] < 0.9
    assert heavy["regime"] == "overloaded" and heavy["backlog_slope_rps"] > 0.04 * 96
