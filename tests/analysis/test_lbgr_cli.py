"""The analysis command line (`python -m repro.analysis.lbgr_diagnostics`) and the study's ratio table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.analysis.lbgr_sweep import CELL_SETS, compare, markdown_table
from tests.analysis.test_lbgr_diagnostics import SMALL

ROOT = Path(__file__).resolve().parents[2]


def test_module_command_line_records_one_cell(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "diag"
    proc = subprocess.run(
        [sys.executable, "-m", "repro.analysis.lbgr_diagnostics", "policy=lbgr_lru", *SMALL, "--out", str(out), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ""  # --quiet
    result = json.loads((out / "diagnostics.json").read_text())
    assert result["overrides"][0] == "policy=lbgr_lru"
    assert result["diagnostics"]["decisions"] == 96
    assert result["diagnostics"]["hit_served"] == pytest.approx(result["summary"]["hit_rate"])
    assert set(result["theta_final"]) <= {"0", "1", "2", "3"} and result["theta_final"]
    d = pd.read_parquet(out / "decisions.parquet")
    assert len(d) == 96 and d["latency_s"].notna().all()
    assert len(pd.read_parquet(out / "thetas.parquet")) == 96


def test_bad_override_fails_before_running(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "repro.analysis.lbgr_diagnostics", "policy=no_such_policy", "--out", str(tmp_path / "x")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0 and "no_such_policy" in proc.stderr
    assert not (tmp_path / "x").exists()


def _study_frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for cell in ("a", "b"):
        for seed in (0, 1):
            for pol in ("base", "v"):
                rows.append({"cell": cell, "seed": seed, "policy": pol, "hit_rate": rng.uniform(0, 1),
                             **{m: rng.uniform(0.5, 2.0) for m in ("latency_p50_s", "latency_p95_s", "ttft_p50_s",
                                                                    "ttft_p95_s", "throughput_rps")}})
    return pd.DataFrame(rows)


def test_compare_is_the_geometric_mean_ratio_to_the_baseline():
    df = _study_frame()
    out = compare(df, "base")
    b = df[df.policy == "base"].reset_index(drop=True)
    v = df[df.policy == "v"].reset_index(drop=True)
    for m in ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "throughput_rps"):
        ratios = [x / y for x, y in zip(v[m], b[m])]
        assert out.loc["v", m] == pytest.approx(float(np.prod(ratios)) ** (1 / len(ratios)))
    per = [np.sqrt(v.latency_p50_s[i] / b.latency_p50_s[i] * v.latency_p95_s[i] / b.latency_p95_s[i]) for i in range(4)]
    assert out.loc["v", "score"] == pytest.approx(float(np.prod(per)) ** 0.25)
    assert out.loc["v", "worst"] == pytest.approx(max(per))
    assert out.loc["v", "hit_diff"] == pytest.approx(float(np.mean(v.hit_rate - b.hit_rate)))
    assert out.loc["base", "score"] == pytest.approx(1.0)
    table = markdown_table(df)
    assert len(table.splitlines()) == 2 + 4  # header, rule, one row per (cell, policy)


def test_protocol_cell_sets_keep_tuning_and_evaluation_seeds_apart():
    (_, tuning_seeds), (_, eval_seeds) = CELL_SETS["tuning"], CELL_SETS["evaluation"]
    assert not set(tuning_seeds) & set(eval_seeds)
