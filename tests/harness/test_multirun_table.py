"""A -m sweep's end table tells skipped cells from run ones (issue 41, point 9: a rerun said "ran"
for every cell it skipped)."""

from __future__ import annotations

from tests.harness.helpers import run_subprocess

NO_WANDB = "tracking=disabled"


def _statuses(stdout: str, sigs) -> dict[str, str]:
    out = {}
    for ln in stdout.splitlines():
        if not (ln.split() and ln.split()[0].isdigit()):  # the end table's rows only
            continue
        for s in sigs:
            if s in ln.split():
                out[s] = next(w for w in ("ran", "copied", "skipped", "failed", "missing") if w in ln.split())
    return out


def test_a_rerun_of_a_multirun_sweep_says_skipped(tmp_path):
    first = run_subprocess(tmp_path, "-m", "+exp=tiny", NO_WANDB, "hydra/launcher=basic", timeout=300)
    assert first.returncode == 0, first.stderr
    sigs = {p.parent.name for p in (tmp_path / "tiny").glob("*/summary.json")}
    assert len(sigs) == 4
    assert set(_statuses(first.stdout, sigs).values()) == {"ran"}
    assert "tiny: 4 finished (4 ran, 0 copied from a finished twin, 0 skipped)" in first.stdout
    again = run_subprocess(tmp_path, "-m", "+exp=tiny", NO_WANDB, "hydra/launcher=basic", timeout=300)
    assert again.returncode == 0, again.stderr
    assert set(_statuses(again.stdout, sigs).values()) == {"skipped"}, again.stdout
    assert "tiny: 4 finished (0 ran, 0 copied from a finished twin, 4 skipped)" in again.stdout
