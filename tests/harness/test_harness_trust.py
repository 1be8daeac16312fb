"""Issue 14 as a user meets it: stale cells, one sweep per cell, stops that stop, folder errors,
W&B failing, exit codes, nothing written in the cwd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from repro.results.store import CellStore
from tests.harness.helpers import ROOT, cli_args, run_inprocess, run_subprocess

NO_WANDB = "tracking=disabled"


def start(results: Path, *args: str, marker: str, cwd: Path = ROOT) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPRO_RESULTS_DIR": str(results), "REPRO_TEST_MARKER": marker}
    return subprocess.Popen([sys.executable, "-m", "repro.run", *cli_args(results, *args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries the marker (the sweep and its workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"REPRO_TEST_MARKER={marker}".encode() in env and state != "Z":
            out.append(int(d.name))
    return out


def wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def no_half_written_cells(root: Path) -> None:
    for d in root.glob("tiny_fake/*"):
        names = {p.name for p in d.iterdir()}
        assert "summary.json" in names or not (names - {".lock"}), (d, names)
        assert ".lock" not in names, d


# -- stale results ------------------------------------------------------------------------------
def test_stale_cell_is_shown_rerun_or_kept(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    cell = sorted((tmp_path / "tiny").iterdir())[0]
    fpath = cell / "fingerprint.json"
    f = json.loads(fpath.read_text())
    f["code"]["repro/routing/lbgr.py"] = "0" * 64  # as if made by another version of the router
    f["fingerprint"] = "old"
    fpath.write_text(json.dumps(f))
    store = CellStore.at(cell)
    store.finish(store.summary_path.read_bytes())  # sealed as such: made by other code, not damaged
    before = (cell / "summary.json").read_bytes()

    assert run_inprocess(tmp_path, "+exp=tiny", "--dry-run", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "tiny: 4 cell(s), 3 finished, 1 stale, 1 to run" in out
    assert f"{cell.name}  stale" in out and "code: repro/routing/lbgr.py changed" in out

    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", "keep_stale=true", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "0 ran, 0 copied (from a finished twin), 4 skipped (finished, 1 of them stale (kept: keep_stale=true))" in out and "skipped (stale)" in out

    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    out = capsys.readouterr().out
    assert "tiny: 1 ran (1 were stale), 0 copied (from a finished twin), 3 skipped (finished), 0 failed" in out and "ran (was stale)" in out
    assert (cell / "summary.json").read_bytes() == before  # same code: same numbers
    assert json.loads(fpath.read_text())["fingerprint"] != "old"


def test_legacy_cell_without_fingerprint_is_stale(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    for f in tmp_path.glob("tiny/*/fingerprint.json"):
        f.unlink()
        (f.parent / CellStore.MANIFEST).unlink()  # made before either existed
    capsys.readouterr()
    assert run_inprocess(tmp_path, "+exp=tiny", "--dry-run", monkeypatch=monkeypatch) == 0
    assert "0 finished, 4 stale, 4 to run" in capsys.readouterr().out


def test_equal_settings_are_one_cell(tmp_path, monkeypatch, capsys):
    sigs = []
    for value in ("3", "3.0"):
        assert run_inprocess(tmp_path, "+exp=tiny", "policy=lbgr_rlt", "workload.request_rate=6",
                             f"router.rls_pool_regularization={value}", "--dry-run", monkeypatch=monkeypatch) == 0
        sigs.append(capsys.readouterr().out.split()[1])
    assert sigs[0] == sigs[1]


def test_explicit_missing_data_path_is_an_error(tmp_path, monkeypatch, capsys):
    for wl in ("ultrachat", "loogle"):
        code = run_inprocess(tmp_path, "+exp=tiny", f"workload={wl}", "workload.path=/no/such/file", "--dry-run",
                             monkeypatch=monkeypatch)
        err = capsys.readouterr().err
        assert code == 2 and "data file not found: /no/such/file" in err, err


@pytest.mark.parametrize("overrides", [["router=random"], ["eviction=lru"], ["policy=cache_aware_rlt", "router=lbgr"]])
def test_a_system_name_that_is_not_what_runs_is_an_error(tmp_path, monkeypatch, capsys, overrides):
    """Issue 32 point 6: router=random under the default policy lbgr_rlt keeps policy_name LBGR+RLT;
    figures group by that name, so the cell is refused before anything runs."""
    code = run_inprocess(tmp_path, "+exp=tiny", *overrides, "--dry-run", monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and "does not name the router" in err and "policy=" in err, err
    assert not (tmp_path / "results").exists()


def test_the_policy_group_names_every_pair_it_composes(tmp_path, monkeypatch, capsys):
    from hydra_plugins.repro_policies import policies

    names = ",".join(sorted(policies()))
    assert run_inprocess(tmp_path, "+exp=tiny", f"policy={names}", "--dry-run", monkeypatch=monkeypatch) == 0


# -- exit codes, working directory ------------------------------------------------------------
@pytest.mark.parametrize("override", ["policy=foo", "cluster.num_workerz=3", "cluster.num_workers=four"])
def test_config_errors_hydra_catches_exit_2(tmp_path, override):
    res = subprocess.run([sys.executable, "-m", "repro.run", "+exp=tiny", override], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "REPRO_RESULTS_DIR": str(tmp_path / "r")},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-1500:]
    assert sorted(os.listdir(tmp_path)) == []  # no outputs/, no .cache/, no results


@pytest.mark.parametrize("value", ["", "' '"])
def test_an_empty_results_dir_is_an_error_not_the_project_root(tmp_path, value):
    """issue 34 (5): `results_dir=` wrote 90 cells and .tracking_id into the project root, exit 0."""
    before = sorted(os.listdir(ROOT))
    res = run_subprocess(tmp_path, "+exp=tiny", f"results_dir={value}", NO_WANDB)
    assert res.returncode == 2, res.stderr[-1500:]
    assert "results_dir must name a folder" in res.stderr and "Traceback" not in res.stderr
    assert sorted(os.listdir(ROOT)) == before and not (tmp_path / "tiny").exists()


def test_dry_run_from_another_directory_writes_nothing_and_sees_the_project_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REPRO_RESULTS_DIR", "REPRO_CACHE_DIR")}
    res = subprocess.run([sys.executable, "-m", "repro.run", "+exp=fig4_order", "--dry-run"], cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-1500:]
    n_committed = len(list((ROOT / "results" / "fig4_order").glob("*/summary.json")))
    last = res.stdout.strip().splitlines()[-1]  # "fig4_order: C cell(s), F finished, S stale, N to run"
    words = last.replace(",", "").split()
    assert words[0] == "fig4_order:" and words[2] == "cell(s)" and int(words[1]) >= n_committed, last
    assert int(words[3]) + int(words[5]) == n_committed  # the repository's results/, not <cwd>/results
    assert os.listdir(tmp_path) == []


def test_no_experiment_says_where_it_writes(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "--dry-run", monkeypatch=monkeypatch) == 0
    assert "no +exp=NAME given" in capsys.readouterr().err


# -- folder errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("n_jobs", ["1", "2"])
def test_unwritable_results_folder_fails_before_any_work(tmp_path, n_jobs):
    res = run_subprocess(tmp_path, "+exp=tiny", NO_WANDB, f"n_jobs={n_jobs}", "results_dir=/proc/x")
    assert res.returncode == 2, res.stderr[-1500:]
    assert "results folder /proc/x/tiny is not writable" in res.stderr and "Traceback" not in res.stderr


def test_a_cell_folder_error_stays_in_that_cell(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", "--dry-run", monkeypatch=monkeypatch) == 0
    first_sig = capsys.readouterr().out.split()[1]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / first_sig).write_text("a file where the cell folder should be")
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 1
    out = capsys.readouterr().out
    assert "tiny: 3 ran, 0 copied (from a finished twin), 0 skipped (finished), 1 failed" in out and "cell 0 FAILED" in out
    assert "no error.txt could be written" in out


# -- W&B failing -------------------------------------------------------------------------------------
@pytest.mark.wandb
def test_failing_wandb_is_tried_once_per_sweep(tmp_path, monkeypatch, capsys):
    import wandb

    calls = []

    def down(*a, **k):
        calls.append(1)
        raise TimeoutError("W&B server did not answer")

    monkeypatch.setattr(wandb, "init", down)
    with pytest.warns(RuntimeWarning):
        assert run_inprocess(tmp_path, "+exp=tiny", "tracking=online", "n_jobs=1", monkeypatch=monkeypatch) == 0
    captured = capsys.readouterr()
    assert len(calls) == 1
    assert captured.err.count("tracking is off for the rest of this sweep") == 1
    assert len(list(tmp_path.glob("tiny/*/summary.json"))) == 4


# -- one sweep per cell, stops that stop --------------------------------------------------------
def test_two_identical_sweeps_into_one_folder_never_duplicate(tmp_path):
    args = ("+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=1.0")
    a, b = (start(tmp_path, *args, marker=uuid.uuid4().hex) for _ in range(2))
    outs = [p.communicate(timeout=180) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, [o[1][-1500:] for o in outs]
    ran = [int(o[0].split("tiny_fake: ")[1].split(" ran")[0]) for o in outs]
    assert sum(ran) == 4, [o[0] for o in outs]
    assert not list(tmp_path.glob("tiny_fake/*/error.txt"))
    assert not list(tmp_path.glob("tiny_fake/*/.lock"))
    assert len(list(tmp_path.glob("tiny_fake/*/summary.json"))) == 4


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_the_sweep_stops_its_workers(tmp_path, how):
    marker = uuid.uuid4().hex
    # 8 cells of 4 s on 2 workers: far from done when the signal comes
    p = start(tmp_path, "+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=4.0", "seed=0,1", marker=marker)
    wait_for(lambda: len(processes_with(marker)) >= 3 and list(tmp_path.glob("tiny_fake/*/config.yaml")), 90,
             "the workers to start cells")
    t0 = time.monotonic()
    if how == "SIGINT":
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    else:
        os.kill(p.pid, getattr(signal, how))
    _, err = p.communicate(timeout=30)
    wait_for(lambda: not processes_with(marker), 15, "every worker to exit")
    took = time.monotonic() - t0
    assert took < 15, (took, err[-3000:])
    assert p.returncode == {"SIGTERM": 143, "SIGINT": 130, "SIGKILL": -9}[how], (p.returncode, err[-3000:])
    no_half_written_cells(tmp_path)  # SIGKILL too: the workers clean up as they exit
    assert len(list(tmp_path.glob("tiny_fake/*/summary.json"))) < 8, err[-3000:]


def test_a_worker_never_has_ctrl_c_live_even_while_it_starts():
    # The terminal sends Ctrl-C to the whole group: a spawned worker still importing (SIGINT
    # not yet ignored) would die half-started. It is born with SIGINT blocked and ignores it
    # before unblocking, so at every moment SIGINT is in its SigBlk or its SigIgn.
    import multiprocessing

    from repro.harness.pool import _Worker

    bit = 1 << (signal.SIGINT - 1)

    def masks(pid: int) -> tuple[int, int] | None:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            return None
        f = dict(ln.split(":\t", 1) for ln in lines if ln.startswith(("SigBlk", "SigIgn")))
        return int(f["SigBlk"], 16), int(f["SigIgn"], 16)

    ctx = multiprocessing.get_context("spawn")
    tracking_event = ctx.Event()  # held here: the child unpickles it after start()
    w = _Worker(ctx, tracking_event)
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, set()) & {signal.SIGINT}  # the parent's mask is back
    try:
        samples = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10.0:
            m = masks(w.proc.pid)
            if m is not None:
                samples.append(m)
                if m[1] & bit and not m[0] & bit:  # in _worker_main: ignored, unblocked
                    break
        assert samples and all((blk | ign) & bit for blk, ign in samples), [f"{b:x}/{i:x}" for b, i in samples[:10]]
        assert samples[-1][1] & bit and not samples[-1][0] & bit, "the worker never got to ignore SIGINT"
    finally:
        w.conn.send(None)
        w.proc.join(10)


@pytest.mark.parametrize("action,code", [("term_in_library", 143), ("int_in_library", 130)])
def test_a_stop_a_library_swallows_is_still_a_stop_not_a_failure(tmp_path, monkeypatch, capsys, action, code):
    """issue 34 (3): OmegaConf turned a worker's stop signal into a ConfigKeyError; the cell was
    marked failed (error.txt) and the sweep went on. The signal arrives inside such a library
    at a chosen point (the second cell's start)."""
    from repro.harness import faults

    monkeypatch.setattr(faults, "_counts", {})  # this process's cells are counted from here
    monkeypatch.setenv("REPRO_FAULT", f"{action}:start:2")
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == code
    err = capsys.readouterr().err
    assert "stopped" in err and "FAILED" not in err, err[-2000:]
    assert not list(tmp_path.glob("tiny/*/error.txt"))
    cells = [d for d in (tmp_path / "tiny").iterdir() if not d.name.startswith(".")]
    assert [sorted(p.name for p in d.iterdir()) for d in cells] == [sorted(p.name for p in cells[0].iterdir())]
    assert (cells[0] / "summary.json").is_file()  # the first cell finished; the second left no folder
