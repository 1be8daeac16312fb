"""The cell time series against plain references: windows from the records, samples from the simulator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from repro.backends import sim as sim_backend
from repro.tracking.series import WINDOW_POINTS, cell_series, read_series, series_bytes, series_meta
from tests.harness.helpers import compose_fixture


def random_records(rng, n=400, m=3) -> pd.DataFrame:
    arrival = np.sort(rng.uniform(0, 50, n))
    first = arrival + rng.exponential(0.2, n)
    finish = first + rng.exponential(1.0, n)
    failed = rng.uniform(size=n) < 0.05
    prompt = rng.integers(10, 500, n)
    df = pd.DataFrame({
        "id": np.arange(n), "worker": rng.integers(0, m, n), "arrival_s": arrival,
        "first_token_s": np.where(failed, np.nan, first), "finish_s": np.where(failed, np.nan, finish),
        "prompt_tokens": prompt, "cached_tokens": (prompt * rng.uniform(0, 1, n)).astype(int),
        "output_tokens": np.full(n, 4), "group": np.zeros(n, dtype=int), "failed": failed,
    })
    return df


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_windows_match_a_per_window_reference(seed):
    rec = random_records(np.random.default_rng(seed))
    s = cell_series(rec, None, max_points=100)
    t = s["sim_time_s"].to_numpy()
    dt = t[1] - t[0]
    ok = rec[~rec.failed]
    for k, g in enumerate(t):
        win = ok[(ok.finish_s > g - WINDOW_POINTS * dt) & (ok.finish_s <= g)]
        assert s["completed"][k] == (ok.finish_s <= g).sum()
        assert s["window/completed_rps"][k] == pytest.approx(len(win) / (WINDOW_POINTS * dt), rel=1e-5)
        if len(win) == 0:
            assert np.isnan(s["window/latency_p50_s"][k]) and np.isnan(s["window/hit_rate"][k])
            continue
        lat, ttft = win.finish_s - win.arrival_s, win.first_token_s - win.arrival_s
        assert s["window/latency_p50_s"][k] == pytest.approx(np.percentile(lat, 50), rel=1e-5)
        assert s["window/latency_p95_s"][k] == pytest.approx(np.percentile(lat, 95), rel=1e-5)
        assert s["window/ttft_p50_s"][k] == pytest.approx(np.percentile(ttft, 50), rel=1e-5)
        assert s["window/ttft_p95_s"][k] == pytest.approx(np.percentile(ttft, 95), rel=1e-5)
        assert s["window/hit_rate"][k] == pytest.approx(win.cached_tokens.sum() / win.prompt_tokens.sum(), rel=1e-5)


def sim_cell(*overrides, tracking="offline"):
    cfg = compose_fixture(["exp=tiny", f"tracking={tracking}", *overrides])
    return sim_backend.run_cell(OmegaConf.create(cfg))


@pytest.mark.parametrize("max_points", [8, 320])
def test_sampled_in_flight_matches_the_records_and_sampling_changes_nothing(max_points):
    over = ("workload.num_queries=200", "workload.request_rate=40.0", f"tracking.max_points={max_points}")
    res = sim_cell(*over)
    assert res.records.equals(sim_cell(*over, tracking="disabled").records)  # same simulation
    s = res.samples
    k = len(s["time_s"])
    assert max_points // 2 <= k <= max_points
    assert np.allclose(np.diff(s["time_s"]), s["time_s"][1] - s["time_s"][0])
    rec = res.records
    assert s["time_s"][-1] >= rec.finish_s.max()  # the grid runs past the last completion
    for j, t in enumerate(s["time_s"]):  # state after every event before t
        for w in range(s["in_flight"].shape[1]):
            on = rec[rec.worker == w]
            assert s["in_flight"][j, w] == ((on.arrival_s < t) & (on.finish_s >= t)).sum()
    assert (s["queue"] <= s["in_flight"]).all()
    assert (s["kv_used_tokens"] <= s["kv_capacity_tokens"][None, :]).all()
    series = cell_series(rec, s)
    assert len(series) == k and series["in_flight/w1"].tolist() == s["in_flight"][:, 1].tolist()
    assert series["kv_use/w0"].between(0, 1).all()


def test_series_file_is_deterministic_and_small(tmp_path):
    res = sim_cell("cluster.num_workers=10", "workload.num_queries=300")
    series = cell_series(res.records, res.samples)
    meta = series_meta(series, swept={"policy": "random_lru"})
    data = series_bytes(series, meta)
    assert data == series_bytes(cell_series(res.records, res.samples), meta)
    assert len(series.columns) == 8 + 3 * 10
    # the cap the docs state: 320 points x 10 workers < 80 KiB, with incompressible values (worst case)
    rng = np.random.default_rng(0)
    big = pd.DataFrame({c: rng.uniform(0, 1000, 320).astype(series[c].dtype) for c in series.columns})
    assert len(series_bytes(big, meta)) < 80 * 1024
    (tmp_path / "ts.parquet").write_bytes(data)
    back, meta_back = read_series(tmp_path / "ts.parquet")
    assert meta_back == meta and back.equals(series)
