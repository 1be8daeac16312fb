"""The LBGR tuning protocol (`python -m repro.analysis.lbgr_diagnostics tune`): tuning seeds only, prediction error as the
objective, the ratio to the baseline reported, bad input refused before anything runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repro.analysis import lbgr_sweep as S
from repro.analysis import lbgr_tune as L
from repro.analysis.lbgr_diagnostics import main
from tests.analysis.test_lbgr_diagnostics import SMALL


def test_tuning_cells_span_the_papers_conditions():
    workloads = {c[0] for c in L.TUNE_CELLS}
    rates = {float(c[-1].split("=")[1]) for c in L.TUNE_CELLS}
    assert workloads == {"workload=gsp", "workload=sharegpt", "workload=ultrachat", "workload=loogle"}
    assert rates == {4.0, 8.0, 12.0, 16.0, 20.0}
    assert any("${limited_kv_cache_tokens" in c[1] for c in L.TUNE_CELLS)  # the limited budgets themselves
    assert set(L.QUICK_CELLS) <= set(L.TUNE_CELLS)
    # never a figure's cell: the evaluation set uses seeds 0-2, tuning 100-102
    assert not set(S.TUNING_SEEDS) & set(S.EVALUATION_SEEDS)


def test_evaluation_seeds_are_refused(tmp_path):
    with pytest.raises(ValueError, match="tuning seeds"):
        L.tune("lbgr_rlt", {"defaults": []}, L.QUICK_CELLS[:1], (0,), tmp_path)


def test_variants_one_at_a_time_and_factorial():
    params = {"router.decay_factor": ("0.8", "0.9"), "router.min_load_weight": ("null", "0.25")}
    defaults = {"router.decay_factor": "0.9", "router.min_load_weight": "0.25"}
    oat = L.tune_variants(params, "oat", defaults)
    assert oat == {"defaults": [], "decay_factor=0.8": ["router.decay_factor=0.8"],
                   "min_load_weight=null": ["router.min_load_weight=null"]}
    fac = L.tune_variants(params, "factorial", defaults)
    assert len(fac) == 4 and ["router.decay_factor=0.8", "router.min_load_weight=null"] in fac.values()


def test_prediction_error_against_a_reference():
    rng = np.random.default_rng(3)
    lat = rng.uniform(0.1, 2.0, 50)
    e = lat * rng.uniform(0.5, 1.5, 50)
    d = pd.DataFrame({"latency_s": lat, "predicted_s_chosen": e})
    p = L.prediction_errors(d)
    assert p["n"] == 50
    assert p["nmae"] == pytest.approx(sum(abs(a - b) for a, b in zip(lat, e)) / sum(lat))
    assert p["bias"] == pytest.approx(sum(a - b for a, b in zip(lat, e)) / sum(lat))
    perfect = L.prediction_errors(pd.DataFrame({"latency_s": lat, "predicted_s_chosen": lat}))
    assert perfect["nmae"] == 0 and perfect["corr"] == pytest.approx(1.0)


def test_tune_end_to_end_on_a_small_cell(tmp_path):
    cell = tuple(c for c in SMALL if not c.startswith("tracking")) + ("workload.request_rate=40.0",)
    variants = L.tune_variants({"router.decay_factor": ("0.5", "0.9")}, "oat", {"router.decay_factor": "0.9"})
    df = L.tune("lbgr_rlt", variants, [cell], (100,), tmp_path / "cache", n_jobs=1)
    assert sorted(df["variant"]) == ["baseline", "decay_factor=0.5", "defaults"]
    lbgr = df[df.variant != "baseline"]
    assert (lbgr["pred_n"] == 96).all() and (lbgr["pred_nmae"] > 0).all()
    assert df.loc[df.variant == "baseline", "pred_nmae"].isna().all()  # Cache-Aware predicts nothing
    rep = L.tune_report(df)
    assert set(rep.index) == {"defaults", "decay_factor=0.5"}
    assert rep.loc["defaults", "pred_nmae"] == pytest.approx(lbgr.set_index("variant").loc["defaults", "pred_nmae"])
    b = df[df.variant == "baseline"].iloc[0]
    d = lbgr.set_index("variant").loc["defaults"]
    assert rep.loc["defaults", "p50_ratio"] == pytest.approx(d["latency_p50_s"] / b["latency_p50_s"])
    # cached: a rerun reads the files and gives the same rows
    again = L.tune("lbgr_rlt", variants, [cell], (100,), tmp_path / "cache", n_jobs=1)
    pd.testing.assert_frame_equal(df, again)


def test_cli_refuses_an_unknown_parameter_before_running(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--param", "router.no_such_key=1,2", "--quick", "--cache-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "not a key" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
