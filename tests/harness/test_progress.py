"""Progress a person sees without a terminal: one line per finished cell, and -m runs end with the table."""

from __future__ import annotations

import io
import json
from pathlib import Path

from repro.harness.progress import SweepProgress
from tests.harness.helpers import run_subprocess

NO_WANDB = "tracking=disabled"


def test_lines_when_not_a_terminal():
    out = io.StringIO()
    bar = SweepProgress(4, "fig2_main", stream=out, min_interval_s=3600)
    for failed in (False, False, True, False):
        bar.update(failed=failed)
    bar.close()
    lines = out.getvalue().splitlines()
    # the first line, every failure and the last line; the rest is throttled
    assert [ln.split(" cells")[0] for ln in lines] == ["[fig2_main] 1/4", "[fig2_main] 3/4", "[fig2_main] 4/4"]
    assert "1 failed" in lines[1] and "ETA" in lines[1] and lines[-1].endswith("ETA -")


def test_a_line_per_cell_every_time_when_unthrottled():
    out = io.StringIO()
    bar = SweepProgress(3, "x", stream=out, min_interval_s=0)
    for _ in range(3):
        bar.update()
    assert len(out.getvalue().splitlines()) == 3


def test_inprocess_grid_prints_progress_lines_to_a_pipe(tmp_path):
    res = run_subprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[tiny] ")]
    assert lines and lines[-1].startswith("[tiny] 4/4 cells done, 0 failed")


def test_multirun_prints_the_summary_table(tmp_path):
    res = run_subprocess(tmp_path, "-m", "+exp=tiny", NO_WANDB, "hydra/launcher=basic", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "tiny: 4 finished (4 ran, 0 copied from a finished twin, 0 skipped), 0 failed, 0 missing" in res.stdout
    header = next(ln for ln in res.stdout.splitlines() if "status" in ln and "sig" in ln)
    assert "policy" in header and "hit_rate" in header
    sigs = {p.parent.name for p in (tmp_path / "tiny").glob("*/summary.json")}
    assert len(sigs) == 4 and all(s in res.stdout for s in sigs)
    assert all(json.loads((tmp_path / "tiny" / s / "summary.json").read_text())["num_requests"] == 24 for s in sigs)
