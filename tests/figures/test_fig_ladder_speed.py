"""repro.figures.gap_ladder and fig2_speed on tiny hand-written cell folders: grouping by rung and
paper system (never by policy_name), the carried-forward cells, the ratios against a reference
computed here, and where the four Fig. 2 numbers occur together."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fig_fixture import config, write_cell
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.figures import fig2_speed, gap_ladder
from repro.figures.load import ResultsError

# one value per (metric, system) and a per-seed factor, chosen so each rung moves the ratios
BASE_RUN = {"latency_p50_s": 10.0, "ttft_p50_s": 8.0, "hit_rate": 0.30, "throughput_rps": 9.0}
OURS_RUN = {"latency_p50_s": 1.0, "ttft_p50_s": 0.5, "hit_rate": 0.40, "throughput_rps": 12.0}
LADDER = {"r0": ("baseline", "ours"), "r1": ("baseline", "ours"), "r2": ("baseline", "ours"),
          "r3": ("baseline",), "r4": ("ours",), "r5": ("ours",), "r6": ("baseline", "ours")}
ARTIFACT_NAMES = [["CacheAware014+LRU", "CacheAware+LRU"], ["LBGRShipped+RLT-shipped", "LBGR+RLT"]]


def summary(values: dict) -> dict:
    return {**values, "latency_p95_s": values["latency_p50_s"] * 3, "ttft_p95_s": values["ttft_p50_s"] * 3,
            "num_requests": 100, "num_failed": 0, "regime": "stable",
            "provenance": {"backend": "sim", "gpu": "l40", "model": "llama31_8b", "seed": 0}}


def values_for(side: str, rung_i: int, seed: int, scale: float = 1.0) -> dict:
    run = BASE_RUN if side == "baseline" else OURS_RUN
    k = (1 + 0.1 * rung_i) * (1 + 0.05 * seed) * scale
    return {m: (v * k if m in gap_ladder.LOWER else v / (1 + 0.02 * rung_i) * (1 + 0.01 * seed)) for m, v in run.items()}


def ladder_results(root, seeds=(0, 1, 2), drop=()):
    for i, (rung, sides) in enumerate(LADDER.items()):
        for side in sides:
            for seed in seeds:
                if (rung, side, seed) in drop:
                    continue
                system = gap_ladder.SIDES[side]
                # the policy_name of a rung is its own (CacheAware014+LRU ...): the module must not key on it
                cfg = config("gap_ladder", {"system": system, "seed": seed}) | {
                    "policy_name": f"{system}@{rung}",
                    "ladder": {"rung": rung, "factor": f"factor of {rung}", "side": side},
                }
                write_cell(root, "gap_ladder", f"{rung}{side[0]}{seed}", cfg, summary(values_for(side, i, seed)), {})
    return root


def reference_ratio(metric: str, b: list[float], o: list[float]) -> tuple[float, float, float]:
    per = [(x / y) if metric in gap_ladder.LOWER else (y / x - 1) for x, y in zip(b, o)]
    mb, mo = float(np.mean(b)), float(np.mean(o))
    return ((mb / mo) if metric in gap_ladder.LOWER else (mo / mb - 1)), min(per), max(per)


def test_ladder_groups_by_rung_and_system_and_carries_unchanged_cells(tmp_path):
    _, out = gap_ladder.table(ladder_results(tmp_path))
    assert list(dict.fromkeys(out[gap_ladder.RUNG])) == list(LADDER)
    assert len(out) == 2 * len(LADDER) and set(out[gap_ladder.SYSTEM]) == {"CacheAware+LRU", "LBGR+RLT"}
    src = out.set_index([gap_ladder.RUNG, gap_ladder.SYSTEM])["carried_from"]
    assert src[("r3", "LBGR+RLT")] == "r2" and src[("r4", "CacheAware+LRU")] == "r3"
    assert src[("r5", "CacheAware+LRU")] == "r3" and src[("r6", "CacheAware+LRU")] == "r6"
    for i, rung in enumerate(LADDER):
        b_i = i if "baseline" in LADDER[rung] else list(LADDER).index(src[(rung, "CacheAware+LRU")])
        o_i = i if "ours" in LADDER[rung] else list(LADDER).index(src[(rung, "LBGR+RLT")])
        row = out[(out[gap_ladder.RUNG] == rung) & (out[gap_ladder.SYSTEM] == "LBGR+RLT")].iloc[0]
        for metric in gap_ladder.METRICS:
            b = [values_for("baseline", b_i, s)[metric] for s in (0, 1, 2)]
            o = [values_for("ours", o_i, s)[metric] for s in (0, 1, 2)]
            want = reference_ratio(metric, b, o)
            got = (row[f"{metric}_ratio"], row[f"{metric}_lo"], row[f"{metric}_hi"])
            assert got == pytest.approx(want, rel=1e-9), (rung, metric)
            mean = out[(out[gap_ladder.RUNG] == rung) & (out[gap_ladder.SYSTEM] == "LBGR+RLT")][metric].iloc[0]
            assert mean == pytest.approx(np.mean(o))


def test_ladder_render_writes_figure_csv_and_markdown(tmp_path):
    paths = gap_ladder.render(ladder_results(tmp_path / "results"), tmp_path / "fig")
    assert {p.name for p in paths} == {f"gap_ladder.{e}" for e in ("png", "pdf", "csv", "md", "caption.txt")}
    md = (tmp_path / "fig" / "gap_ladder.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| r") and not line.startswith("| rung")]
    assert [r.split("|")[1].strip() for r in rows] == list(LADDER)
    assert "(=r3)" in rows[4] and "(=r2)" in rows[3] and "factor of r5" in rows[5]
    csv = pd.read_csv(tmp_path / "fig" / "gap_ladder.csv")
    assert len(csv) == 14 and "latency_p50_s_ratio" in csv
    assert "11.96×" in (tmp_path / "fig" / "gap_ladder.caption.txt").read_text()


def test_ladder_pairs_seeds_and_refuses_a_system_missing_from_the_start(tmp_path):
    # seed 2 of r1's LBGR+RLT missing: r1's ratios use seeds 0 and 1 only
    _, out = gap_ladder.table(ladder_results(tmp_path / "a", drop={("r1", "ours", 2)}))
    row = out[(out[gap_ladder.RUNG] == "r1") & (out[gap_ladder.SYSTEM] == "LBGR+RLT")].iloc[0]
    b = [values_for("baseline", 1, s)["latency_p50_s"] for s in (0, 1)]
    o = [values_for("ours", 1, s)["latency_p50_s"] for s in (0, 1)]
    assert row["latency_p50_s_ratio"] == pytest.approx(reference_ratio("latency_p50_s", b, o)[0])
    with pytest.raises(ResultsError, match="no LBGR\\+RLT cells at or before rung r0"):
        gap_ladder.table(ladder_results(tmp_path / "b", drop={("r0", "ours", s) for s in (0, 1, 2)}))


def speed_results(root, table: dict, seeds=(0, 1), paper_names=True):
    """table: {speed: (baseline values, ours values)}; cells named as protocol=artifact names them."""
    for speed, (b, o) in table.items():
        for side, vals, name in (("baseline", b, "CacheAware014+LRU"), ("ours", o, "LBGRShipped+RLT-shipped")):
            for seed in seeds:
                system = gap_ladder.SIDES[side]
                cfg = config("fig2_speed", {"system": system, "seed": seed, "speed_factor": speed})
                if paper_names:
                    cfg |= {"policy_name": name, "protocol": {"name": "artifact", "paper_names": ARTIFACT_NAMES}}
                noisy = {m: v * (1 + 0.01 * seed) for m, v in vals.items()}
                write_cell(root, "fig2_speed", f"s{speed}{side[0]}{seed}", cfg, summary(noisy), {})
    return root


def paper_like(f_lat: float, f_ttft: float, d_hit: float, d_tput: float) -> tuple[dict, dict]:
    b = {"latency_p50_s": 10.0, "ttft_p50_s": 8.0, "hit_rate": 0.3, "throughput_rps": 9.0}
    o = {"latency_p50_s": 10.0 / f_lat, "ttft_p50_s": 8.0 / f_ttft, "hit_rate": 0.3 * (1 + d_hit),
         "throughput_rps": 9.0 * (1 + d_tput)}
    return b, o


@pytest.mark.parametrize("paper_names", [True, False])
def test_speed_finds_where_all_four_occur_together(tmp_path, paper_names):
    table = {0.5: paper_like(1.5, 1.5, 0.05, 0.10),  # too small
             1.0: paper_like(10.0, 12.0, 0.30, 0.40),  # all four within x2 of the paper's
             2.0: paper_like(30.0, 9.0, 0.30, 0.01)}  # latency too large, throughput too small
    _, out = fig2_speed.table(speed_results(tmp_path / "r", table, paper_names=paper_names))
    assert list(out[fig2_speed.SPEED]) == [0.5, 1.0, 2.0]
    assert fig2_speed.together(out) == [1.0]
    row = out.set_index(fig2_speed.SPEED).loc[1.0]
    assert row["latency_p50_s_ratio"] == pytest.approx(10.0) and row["hit_rate_ratio"] == pytest.approx(0.30)
    paths = fig2_speed.render(tmp_path / "r", tmp_path / "fig")
    assert {p.name for p in paths} == {f"fig2_speed.{e}" for e in ("png", "pdf", "csv", "caption.txt")}
    caption = (tmp_path / "fig" / "fig2_speed.caption.txt").read_text()
    assert "all four agree with the paper's at speed factor(s) 1" in caption
    assert "throughput (paper +36.5 %): 1." in caption and "P50 latency (paper 11.96×): 1;" in caption


def test_speed_says_when_no_factor_has_all_four(tmp_path):
    table = {1.0: paper_like(10.0, 12.0, 0.30, -0.10)}  # throughput in the wrong direction
    root = speed_results(tmp_path / "r", table)
    _, out = fig2_speed.table(root)
    assert fig2_speed.together(out) == []
    fig2_speed.render(root, tmp_path / "fig")
    assert "at no swept speed factor" in (tmp_path / "fig" / "fig2_speed.caption.txt").read_text()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100), st.floats(0.1, 100)), min_size=1, max_size=5),
       st.sampled_from(gap_ladder.METRICS))
def test_ratios_match_the_reference(pairs, metric):
    b = pd.DataFrame({"seed": range(len(pairs)), metric: [p[0] for p in pairs]})
    o = pd.DataFrame({"seed": range(len(pairs)), metric: [p[1] for p in pairs]})
    got = gap_ladder.ratios(b, o, metric)
    want = reference_ratio(metric, [p[0] for p in pairs], [p[1] for p in pairs])
    assert (got["ratio"], got["lo"], got["hi"]) == pytest.approx(want, rel=1e-9)
    assert got["n"] == len(pairs)


def test_paper_numbers_are_the_catalogues():
    assert gap_ladder.paper_numbers() == pytest.approx(
        {"latency_p50_s": 11.96, "ttft_p50_s": 14.06, "hit_rate": 0.3645, "throughput_rps": 0.3651}
    )
