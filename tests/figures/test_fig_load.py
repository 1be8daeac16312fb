"""The one results loader: flattening, cell states, and refusing to pool cells it should not."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.figures.load import ResultsError, aggregate, cell_counts, flatten, load_cells


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": {}}) == {"a.b": 1, "a.c": (1, 2), "d": None, "e": None}


def test_load_cells_columns(fixture_results):
    df = load_cells(fixture_results, "fig5_request_rate")
    for col in ("exp", "signature", "policy_name", "seed", "workload.request_rate", "router.name",
                "cluster.scheduler.max_running_requests", "hit_rate", "latency_p50_s", "prov.backend",
                "prov.workload.synthetic", "timings.harness.backend_wall_s", "eviction_ms_per_query",
                "routing_ms_per_query", "cpu_s"):
        assert col in df, col
    assert len(df) == 12 and df["exp"].eq("fig5_request_rate").all()
    # routing overhead = (routing + completion callbacks) / requests, in ms
    row = df[df["policy_name"] == "LBGR+RLT"].iloc[0]
    expect = (row["timings.routing.total_s"] + row["timings.completion_callback.total_s"]) / row["num_requests"] * 1e3
    assert row["routing_ms_per_query"] == pytest.approx(expect)


def test_missing_experiment_is_empty(tmp_path):
    assert load_cells(tmp_path, "nope").empty
    assert cell_counts(tmp_path, "nope") == {"finished": 0, "failed": 0, "unfinished": 0}


def test_unfinished_and_failed_cells_are_counted_not_read(results_copy):
    exp = results_copy / "fig4_order"
    n = len(list(exp.iterdir()))
    (exp / "deadbeef0001").mkdir()
    (exp / "deadbeef0001" / "config.yaml").write_text("seed: 0\n")
    (exp / "deadbeef0002").mkdir()
    (exp / "deadbeef0002" / "error.txt").write_text("Traceback ...\n")
    assert cell_counts(results_copy, "fig4_order") == {"finished": n, "failed": 1, "unfinished": 1}
    assert len(load_cells(results_copy, "fig4_order")) == n


def test_summary_without_config_is_an_error(results_copy):
    cell = next((results_copy / "fig4_order").iterdir())
    (cell / "config.yaml").unlink()
    with pytest.raises(ResultsError, match="without config.yaml"):
        load_cells(results_copy, "fig4_order")


def _edit_config(cell, **changes):
    cfg = yaml.safe_load((cell / "config.yaml").read_text())
    for dotted, v in changes.items():
        node = cfg
        *path, last = dotted.split(".")
        for p in path:
            node = node[p]
        node[last] = v
    (cell / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_stale_cell_is_refused_not_averaged(results_copy):
    from repro.figures.fig4_order import FIGURE

    cell = sorted((results_copy / "fig4_order").iterdir())[0]
    stale = cell.parent / "stale0000001"
    shutil.copytree(cell, stale)
    _edit_config(stale, **{"workload.num_queries": 512})
    with pytest.raises(ResultsError, match=r"stale.*workload\.num_queries|workload\.num_queries.*stale"):
        FIGURE.table(results_copy)


def test_unshown_difference_is_refused(results_copy):
    from repro.figures.fig2_main import FIGURE

    cells = load_cells(results_copy, "fig2_main")
    sig = cells[(cells["policy_name"] == "LBGR+RLT") & (cells["seed"] == 1)]["signature"].iloc[0]
    _edit_config(results_copy / "fig2_main" / sig, **{"router.tracker": "exact"})
    with pytest.raises(ResultsError, match=r"router\.tracker.*own policy_name"):
        FIGURE.table(results_copy)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(["X", "Y"]), st.floats(0.01, 100)),
                min_size=1, max_size=12))
def test_aggregate_matches_a_plain_reference(rows):
    """Mean / sample SD / count per group, against a direct computation."""
    df = pd.DataFrame(rows, columns=["workload.name", "policy_name", "latency_p50_s"])
    df["seed"] = df.groupby(["workload.name", "policy_name"]).cumcount()
    df["signature"] = [f"s{i}" for i in range(len(df))]
    out = aggregate(df, ["workload.name", "policy_name"], "t", ["latency_p50_s"])
    for _, r in out.iterrows():
        vals = [v for w, p, v in rows if w == r["workload.name"] and p == r["policy_name"]]
        assert r["n_seeds"] == len(vals)
        assert r["latency_p50_s"] == pytest.approx(sum(vals) / len(vals))
        sd = float(np.sqrt(sum((v - np.mean(vals)) ** 2 for v in vals) / (len(vals) - 1))) if len(vals) > 1 else 0.0
        assert r["latency_p50_s_sd"] == pytest.approx(sd, abs=1e-9)
    assert len(out) == len({(w, p) for w, p, _ in rows})
