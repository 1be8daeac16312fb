"""The sweep plots' readability rules (repro/figures/perf.py docstring), checked on the drawn axes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repro.figures import perf
from repro.figures.load import METRICS


def _drawn(monkeypatch, results_dir, tmp_path, name="fig5_request_rate"):
    """Render one sweep figure and return its matplotlib Figure instead of closing it."""
    from repro.figures import artefact

    captured = {}

    def keep(fig, figures_dir, n):
        captured["fig"] = fig
        return []

    monkeypatch.setattr(perf, "save_figure", keep)
    artefact(name).render(results_dir, tmp_path)
    return captured["fig"]


def test_time_panels_share_one_scale_rule():
    agg = pd.DataFrame({"latency_p50_s": [0.1, 3.0], "latency_p95_s": [1.0, 1.5],
                        "ttft_p50_s": [0.1, 0.2], "ttft_p95_s": [0.3, 0.4]})
    assert perf.log_time_panels(agg)  # one panel spans 30x: all four log
    agg["latency_p50_s"] = [0.1, 0.5]
    assert not perf.log_time_panels(agg)


def test_sweep_axes(monkeypatch, fixture_results, tmp_path):
    fig = _drawn(monkeypatch, fixture_results, tmp_path)
    axes = fig.axes[: len(METRICS)]
    scales = {ax.get_yscale() for ax, m in zip(axes, METRICS) if m.endswith("_s")}
    assert len(scales) == 1, scales  # P50 and P95 panels never on different kinds of axis
    styles = set()
    for ax, m in zip(axes, METRICS):
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
        assert lines
        top = ax.get_ylim()[1]
        for ln in lines:
            assert not ln.get_clip_on()  # markers at the edge are drawn whole
            assert np.nanmax(ln.get_ydata()) <= top
        if m == "hit_rate":
            assert max(np.nanmax(ln.get_ydata()) for ln in lines) < top  # headroom above the top marker
        # the same x point is drawn at a different x per system (dodge)
        first_x = [float(ln.get_xdata()[0]) for ln in lines]
        assert len(set(first_x)) == len(first_x)
        styles |= {(ln.get_marker(), str(ln.get_linestyle()), ln.get_color()) for ln in lines}
    assert len({s[0] for s in styles}) >= 6  # one marker per system


def test_log_ticks_readable_on_narrow_panels(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [0.3, 0.55])
    perf.log_axis(ax, 0.3, 0.55)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert len(ticks) >= 3
    plt.close(fig)


@pytest.mark.parametrize("n", [1, 4, 6])
def test_dodge_is_centred_and_small(n):
    off = perf.dodge_offsets([4, 8, 12], n)
    assert abs(off.mean()) < 1e-12 and np.all(np.abs(off) <= perf.DODGE * 4)
    fac = perf.dodge_offsets([16, 32, 64], n, log_base=2)
    assert abs(np.log(fac).mean()) < 1e-12
