"""The harness end to end on the simulator (tests/harness/conf/exp/tiny.yaml: 2 x 2 cells of 24
queries): both run forms, launchers, n_jobs, resume after hard kills, failing cells, bad configs,
inspection."""

from __future__ import annotations

import json
import signal

import pandas as pd
import pytest

from repro.metrics import RECORD_COLUMNS
from tests.harness.helpers import cell_files, reference_tiny_grid, run_inprocess, run_subprocess

NO_WANDB = "tracking=disabled"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, bytes]:
    files = reference_tiny_grid(tmp_path_factory)
    assert len(files) == 8  # 4 cells x (summary.json, requests.parquet)
    return files


def test_cell_folder_contents(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "tiny: 4 ran, 0 copied (from a finished twin), 0 skipped (finished), 0 failed" in out
    assert "lbgr_rlt" in out and "hit_rate" in out  # the summary table
    cells = sorted((tmp_path / "tiny").iterdir())
    assert len(cells) == 4
    for cell in cells:
        assert sorted(p.name for p in cell.iterdir()) == [
            "checksums.sha256",
            "config.yaml",
            "fingerprint.json",
            "requests.parquet",
            "requests.sha256",
            "summary.json",
            "timings.json",
        ]
        assert all((p.stat().st_mode & 0o044) == 0o044 for p in cell.iterdir())  # readable by group/others
        summary = json.loads((cell / "summary.json").read_text())
        assert summary["num_requests"] == 24 and summary["provenance"]["signature"] == cell.name
        assert summary["provenance"]["policy_name"] in ("Random+LRU", "LBGR+RLT")
        assert summary["provenance"]["backend"] == "sim"
        df = pd.read_parquet(cell / "requests.parquet")
        assert list(df.columns) == list(RECORD_COLUMNS) and len(df) == 24
        assert "exp_name: tiny" in (cell / "config.yaml").read_text()


def test_multirun_basic_launcher_gives_identical_files(tmp_path, monkeypatch, reference):
    rc = run_inprocess(tmp_path, "-m", "+exp=tiny", NO_WANDB, "hydra/launcher=basic", monkeypatch=monkeypatch)
    assert rc == 0
    assert cell_files(tmp_path) == reference


def test_two_local_processes_give_identical_files(tmp_path, monkeypatch, reference):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=2", monkeypatch=monkeypatch) == 0
    assert cell_files(tmp_path) == reference


def test_rerun_skips_finished_cells(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("tiny/*/*")}
    capsys.readouterr()
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    assert "tiny: 0 ran, 0 copied (from a finished twin), 4 skipped (finished), 0 failed" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("tiny/*/*")} == stamps


def test_sweep_overrides_on_the_command_line_extend_the_grid(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "seed=0,1", "n_jobs=1", monkeypatch=monkeypatch) == 0
    assert "tiny: 8 ran" in capsys.readouterr().out
    assert len(list(tmp_path.glob("tiny/*/summary.json"))) == 8


def test_hard_kill_mid_sweep_then_resume(tmp_path, reference):
    """SIGKILL the sweep while the 3rd cell is between its parquet and its summary; rerun."""
    first = run_subprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", env={"REPRO_FAULT": "kill:before_summary:3"})
    assert first.returncode == -signal.SIGKILL, first.stderr
    finished = {p.parent.name: p.read_bytes() for p in tmp_path.glob("tiny/*/summary.json")}
    assert len(finished) == 2
    unfinished = [d for d in (tmp_path / "tiny").iterdir() if d.name not in finished]
    assert len(unfinished) == 1 and (unfinished[0] / "requests.parquet").exists()
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("tiny/*/summary.json")}

    second = run_subprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1")
    assert second.returncode == 0, second.stderr
    assert "tiny: 2 ran, 0 copied (from a finished twin), 2 skipped (finished), 0 failed" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished cells untouched
    assert cell_files(tmp_path) == reference
    leftovers = [p for p in tmp_path.glob("tiny/**/*") if p.name.startswith(".tmp")]
    assert leftovers == []


@pytest.mark.slow
def test_killed_pool_worker_is_reported_and_resumed(tmp_path, monkeypatch, capsys, reference):
    monkeypatch.setenv("REPRO_FAULT", "kill:start:1")  # each worker process dies on its first cell
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=2", monkeypatch=monkeypatch) == 1
    out = capsys.readouterr().out
    assert "worker process died" in out and "4 failed" in out
    assert not list(tmp_path.glob("tiny/*/summary.json"))
    monkeypatch.delenv("REPRO_FAULT")
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=2", monkeypatch=monkeypatch) == 0
    assert cell_files(tmp_path) == reference


@pytest.mark.parametrize("form", ["inprocess", pytest.param("multirun", marks=pytest.mark.slow)])
def test_failing_cell_is_reported_and_the_others_go_on(tmp_path, form):
    args = ["+exp=tiny", NO_WANDB]
    args = ["-m", *args] if form == "multirun" else [*args, "n_jobs=1"]
    res = run_subprocess(tmp_path, *args, env={"REPRO_FAULT": "raise:start:1;raise:start:3"})
    assert res.returncode == 1, res.stderr[-2000:]
    done = list(tmp_path.glob("tiny/*/summary.json"))
    errors = list(tmp_path.glob("tiny/*/error.txt"))
    assert len(done) == 2 and len(errors) == 2
    for err in errors:
        text = err.read_text()
        assert "Traceback" in text and "injected fault at start" in text
        assert not (err.parent / "summary.json").exists()
    if form == "inprocess":
        assert "2 ran, 0 copied (from a finished twin), 0 skipped (finished), 2 failed" in res.stdout and res.stdout.count("FAILED") == 2


@pytest.mark.parametrize(
    "form,override,fragment",
    [
        ("inprocess", "workload.request_rate=-1,6", "workload.request_rate must be > 0 req/s (got -1.0)"),
        ("inprocess", "cluster.num_workers=0", "cluster.num_workers must be an integer >= 1 (got 0)"),
        ("inprocess", "policy=random_lru,nope", "Could not find 'policy/nope'"),
        ("multirun", "workload.request_rate=-1,6", "workload.request_rate must be > 0 req/s (got -1.0)"),
    ],
)
def test_bad_config_fails_before_any_cell(tmp_path, monkeypatch, capsys, form, override, fragment):
    args = ["+exp=tiny", NO_WANDB, override]
    rc = run_inprocess(tmp_path, *(["-m", *args] if form == "multirun" else args), monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert rc == 2
    assert "invalid configuration" in err and "nothing was run" in err and fragment in err
    assert not (tmp_path / "tiny").exists()


def test_cfg_job_inspection(tmp_path):
    res = run_subprocess(tmp_path, "+exp=tiny", "--cfg", "job")
    assert res.returncode == 0, res.stderr
    assert "exp_name: tiny" in res.stdout and "policy_name: Random+LRU" in res.stdout
    assert not (tmp_path / "tiny").exists()


def test_dry_run_lists_cells(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", "--dry-run", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "tiny: 4 cell(s), 0 finished, 0 stale, 4 to run" in out
    assert not (tmp_path / "tiny").exists()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_other_launchers_give_identical_files(tmp_path, reference, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=5"]
    res = run_subprocess(tmp_path, "-m", "+exp=tiny", NO_WANDB, f"hydra/launcher={launcher}", *extra, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert cell_files(tmp_path) == reference


@pytest.mark.slow
def test_sigkill_of_the_whole_sweep_from_outside_then_resume(tmp_path, reference):
    """`kill -9` of the sweep's process group (main + pool workers) mid-way; the rerun finishes it."""
    import os
    import subprocess
    import sys
    import time

    from tests.harness.helpers import ROOT, cli_args

    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_RESULTS_DIR": str(tmp_path)}
    args = cli_args(tmp_path, "+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=1.5")
    proc = subprocess.Popen([sys.executable, "-m", "repro.run", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("tiny_fake/*/summary.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done = len(list(tmp_path.glob("tiny_fake/*/summary.json")))
    assert 1 <= done < 4
    for summary in tmp_path.glob("tiny_fake/*/summary.json"):  # whatever was finished is whole
        json.loads(summary.read_text())
        pd.read_parquet(summary.parent / "requests.parquet")

    res = run_subprocess(tmp_path, "+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=1.5")
    assert res.returncode == 0, res.stderr
    assert f"{4 - done} ran, 0 copied (from a finished twin), {done} skipped (finished)" in res.stdout
    assert len(cell_files(tmp_path, "tiny_fake")) == 8
    assert not [p for p in tmp_path.glob("tiny_fake/**/*") if p.name.startswith(".tmp")]
