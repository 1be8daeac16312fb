"""Issue 42: override folders drawn next to the paper's figure with a caption saying what differs,
the mixed-folder error naming exp_name= / results_dir=, knob labels, workloads in captions, and
log-axis tick labels that never overprint (fig13)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from repro.figures import render_artefact
from repro.figures.load import ResultsError, aggregate, load_cells


def _copy_exp(results, src, dst, edit=None, rename=None):
    for cell in sorted((results / src).iterdir()):
        out = results / dst / (rename(cell.name) if rename else cell.name)
        shutil.copytree(cell, out)
        (out / "checksums.sha256").unlink(missing_ok=True)
        if edit:
            cfg = yaml.safe_load((out / "config.yaml").read_text())
            edit(cfg)
            (out / "config.yaml").write_text(yaml.safe_dump(cfg))


def _kv(cfg):
    cfg["cluster"]["kv_cache_tokens"] = 16384


def test_an_override_folder_renders_next_to_the_paper_figure(results_copy, tmp_path):
    _copy_exp(results_copy, "fig5_request_rate", "fig5_request_rate+kv16384", _kv)
    figs = tmp_path / "figs"
    figs.mkdir()
    assert render_artefact("fig5_request_rate", results_copy, figs) is None
    assert (figs / "fig5_request_rate.png").is_file() and (figs / "fig5_request_rate+kv16384.png").is_file()
    paper = (figs / "fig5_request_rate.caption.txt").read_text()
    own = (figs / "fig5_request_rate+kv16384.caption.txt").read_text()
    assert "Differs" not in paper
    assert "Differs from the paper's setting: KV cache per worker: 16,384 tokens (paper: not set)." in own
    assert own.startswith("Figure 5: performance vs request rate — KV cache per worker")
    assert "workload: gsp" in paper and "workload: gsp" in own


def test_a_folder_holding_two_settings_names_exp_name_and_plain_numbers(results_copy):
    _copy_exp(results_copy, "fig5_request_rate", "fig5_request_rate", _kv, rename=lambda n: n + "kv")
    df = load_cells(results_copy, "fig5_request_rate")
    with pytest.raises(ResultsError) as err:
        aggregate(df, ["policy_name", "workload.request_rate"], "fig5_request_rate")
    text = str(err.value)
    assert "exp_name=" in text and "results_dir=" in text and "python -m repro.results prune" in text
    assert "np.float64" not in text and "np." not in text
    assert "cluster.kv_cache_tokens: 16384" in text and "workload.request_rate=4" in text


def test_a_custom_experiment_has_readable_axis_and_title(results_copy):
    from repro.figures import generic

    _copy_exp(results_copy, "fig13_batch_size", "my_batches")
    fig = generic.figure_for("my_batches", results_copy)
    assert fig.x == "cluster.scheduler.max_running_requests"
    assert fig.x_label == "max running requests per worker" and fig.x_log == 2
    assert "cluster." not in fig.title and fig.title.startswith("Performance of the six systems vs max running")


def test_knob_labels_come_from_the_table_or_a_readable_fallback():
    from repro.figures.knobs import knob_label

    assert knob_label("workload.request_rate") == "request rate (req/s)"
    assert knob_label("cluster.kv_cache_tokens") == "KV cache per worker (tokens)"
    assert knob_label("router.some_window_s") == "some window (s)"
    assert knob_label("workload.foo_bar") == "foo bar"


def _log_positions(ticks):
    return np.log10(np.asarray(ticks, dtype=float))


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 1e3), st.floats(1.05, 5000.0))
def test_log_ticks_never_crowd(bottom, factor):
    from repro.figures.perf import LABEL_GAP, log_ticks

    top = bottom * factor
    ticks = log_ticks(bottom, top)
    span = math.log10(top) - math.log10(bottom)
    pos = _log_positions(ticks)
    assert list(ticks) == sorted(ticks) and all(bottom * (1 - 1e-9) <= t <= top * (1 + 1e-9) for t in ticks)
    assert np.all(np.diff(pos) >= LABEL_GAP * span - 1e-9)
    # reference: every 1..9 x 10^k in range that keeps the gap to all kept ones, in priority order;
    # "in range" and "keeps the gap" with log_ticks' float slack (1e-9: relative at the limits, in
    # log10 on the gap), so that 1000 on a 1 .. 999.9999999999999 axis is in for both
    kept = []
    for m in (1, 2, 5, 3, 4, 6, 7, 8, 9):
        for e in range(-8, 9):
            v = float(f"{m * 10.0**e:.12g}")
            if bottom * (1 - 1e-9) <= v <= top * (1 + 1e-9) and all(
                abs(math.log10(v / k)) >= LABEL_GAP * span - 1e-9 for k in kept
            ):
                kept.append(v)
    assert np.allclose(sorted(kept), ticks)
    if factor >= 3:
        assert len(ticks) >= 2


def test_fig13s_narrow_log_panels_no_longer_overprint():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures import perf

    # fig13's P50 latency panel (committed results): 0.13 .. 0.85 s; ticks 0.6 0.7 0.8 0.9 1 overprinted
    fig, ax = plt.subplots(figsize=(2.25, 1.95))
    ax.plot([1, 2], [0.13, 0.85])
    perf.log_axis(ax, 0.13, 0.85)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    gaps = np.diff(_log_positions(ticks)) / (math.log10(hi) - math.log10(lo))
    assert len(ticks) >= 3 and gaps.min() >= perf.LABEL_GAP - 1e-9
    boxes = [lab.get_window_extent() for lab in ax.get_yticklabels() if lab.get_text()]
    assert all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
    plt.close(fig)
