"""The high-load diagnostic: realised latency parts and LBGR's prediction parts, on a small cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from small_gsp import SMALL_GSP

from repro.analysis.lbgr_diagnostics import main
from repro.analysis.lbgr_highload import run_cell_diag, table_md

SMALL = SMALL_GSP


@pytest.mark.parametrize("policy", ["lbgr_rlt", "cache_aware_lru"])
def test_latency_parts_add_up_and_lbgr_parts_make_e(policy):
    row, d = run_cell_diag(policy, 40.0, 1500, 0, SMALL)
    assert row["requests"] == len(d) == 96 and d["id"].is_unique
    assert (d["queue_wait_s"] >= 0).all() and (d["prefill_real_s"] > 0).all() and (d["decode_real_s"] >= 0).all()
    parts = row["wait_mean_s"] + row["prefill_mean_s"] + row["decode_mean_s"]
    assert parts == pytest.approx(row["mean_latency_s"])
    assert 0 < row["prefill_busy_frac"] <= row["busy_frac"] <= 1
    assert 0.25 <= row["max_worker_share"] <= 1 and 0 < row["group_home_share"] <= 1
    assert 1 <= row["workers_per_group"] <= 4
    if policy == "lbgr_rlt":
        e = row["S_prefill_pred_s"] + row["S_decode_pred_s"] + row["P_mean_s"] + row["r_mean_s"]
        assert e == pytest.approx(row["E_mean_s"])
        assert row["E_mae_s"] >= abs(row["E_bias_s"])
        assert (d["decode_pred_s"] >= 0).all()
    else:
        assert "E_mean_s" not in row


def test_cli_writes_one_row_per_cell(tmp_path):
    extra = [a for o in SMALL for a in ("--override", o)]
    assert main(["highload", "--rates", "40", "--seeds", "0", "--budget", "1500", "--out", str(tmp_path), *extra]) == 0
    cells = pd.read_csv(tmp_path / "cells.csv")
    assert sorted(cells["system"]) == ["CacheAware+LRU", "LBGR+RLT"] and (cells["requests"] == 96).all()
    text = (tmp_path / "table.md").read_text()
    rows = [line.split(" | ")[3] for line in text.splitlines() if line.startswith("| gsp | 1500 | 40 |")]
    assert rows == ["CacheAware+LRU", "LBGR+RLT"]
    assert text.startswith("`python -m repro.analysis.lbgr_diagnostics highload --rates 40 ")  # the command
    assert "workload.num_queries=96" in text.splitlines()[2]  # the overrides are named
    assert table_md(cells).count("\n| gsp | 1500 | 40 |") == 2
    assert np.isfinite(cells.loc[cells["system"] == "LBGR+RLT", "E_corr"]).all()
    # without an LBGR system the prediction columns stay empty
    baseline = table_md(cells[cells["system"] == "CacheAware+LRU"])
    assert baseline.splitlines()[-1].endswith("|  |  |  |  |  |  |  |  |  |  |")


def test_the_regime_map_caption_names_a_command_that_exists(capsys):
    from repro.figures.regime_map import WHY_COMMAND

    module, sub = WHY_COMMAND.split()[2:4]
    assert module == "repro.analysis.lbgr_diagnostics"
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code == 0 and "--rates" in capsys.readouterr().out
