"""The reliability suite (`make test-reliability`, a step of .ci/run; marker `reliability`): issue 34's
hostile pass repeated as tests, bounded in count (REPRO_RELIABILITY_REPEAT, default 3) and each run
bounded by a hang guard, driven by events (cells started, workers gone), never by sleeps.

- a double Ctrl-C, the second at once or after the first worker stopped: the sweep exits 130,
  leaves no process, no half-written cell, no lock;
- SIGTERM to a `hydra/launcher=joblib` sweep: its loky workers and trackers exit with it; after a
  kill -9 of it too, and they leave no half-written cell and no lock;
- every file a cell's manifest covers, changed in turn: `status` names the cell damaged, the
  next sweep recomputes it byte for byte.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid

import pytest

from repro.results.__main__ import main as results_main
from repro.results.store import CellStore
from tests.harness.helpers import run_inprocess
from tests.harness.test_harness_trust import NO_WANDB, no_half_written_cells, processes_with, start, wait_for

pytestmark = pytest.mark.reliability
REPEAT = int(os.environ.get("REPRO_RELIABILITY_REPEAT", "3"))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # the sweep is already gone: nothing to stop
        pass


@pytest.mark.parametrize("second", ["at_once", "after_a_worker_stopped"])
def test_a_double_ctrl_c_never_hangs(tmp_path, second):
    for k in range(REPEAT):
        results, marker = tmp_path / f"run{k}", uuid.uuid4().hex
        p = start(results, "+exp=tiny_fake", NO_WANDB, "n_jobs=2", "backend.sleep_s=4.0", "seed=0,1", marker=marker)
        wait_for(lambda: len(processes_with(marker)) >= 3 and list(results.glob("tiny_fake/*/config.yaml")), 120,
                 "the workers to start cells")
        n = len(processes_with(marker))
        _signal_group(p.pid, signal.SIGINT)
        if second == "after_a_worker_stopped":
            wait_for(lambda: len(processes_with(marker)) < n, 60, "a worker to stop")
        _signal_group(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)  # the hang guard: a hung sweep fails here
        # 130, or killed by the second Ctrl-C once the sweep had stopped and restored Python's handler
        assert p.returncode in (130, -signal.SIGINT), (k, p.returncode, err[-2000:])
        assert "stopped (Ctrl-C)" in err, err[-2000:]
        wait_for(lambda: not processes_with(marker), 30, "every worker to exit")
        no_half_written_cells(results)
        assert not list(results.glob("tiny_fake/*/error.txt")), err[-2000:]


def test_every_covered_file_changed_is_named_damaged_and_recomputed(tmp_path, monkeypatch, capsys):
    assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
    cell = sorted(p.parent for p in tmp_path.glob("tiny/*/summary.json"))[0]
    good = {n: (cell / n).read_bytes() for n in CellStore.at(cell).manifest()}
    for name in sorted(good)[:REPEAT * 2]:
        data = bytearray(good[name])
        data[len(data) // 2] ^= 0x01
        (cell / name).write_bytes(bytes(data))
        capsys.readouterr()
        assert results_main(["status", "--results-dir", str(tmp_path)]) == 1
        assert f"DAMAGED {cell}: {name} changed" in capsys.readouterr().out
        assert run_inprocess(tmp_path, "+exp=tiny", NO_WANDB, "n_jobs=1", monkeypatch=monkeypatch) == 0
        assert "1 were damaged" in capsys.readouterr().out
        for n, b in good.items():
            if n not in ("timings.json", CellStore.MANIFEST):  # wall-clock timings differ run to run
                assert (cell / n).read_bytes() == b, n
        good = {n: (cell / n).read_bytes() for n in CellStore.at(cell).manifest()}
    shutil.rmtree(tmp_path / "tiny")


def test_sigterm_stops_the_joblib_launchers_workers(tmp_path):
    """issue 34 (4): `hydra/launcher=joblib` exited 143 on SIGTERM and left its loky workers and
    resource trackers running. Now the launcher unwinds and stops them."""
    marker = uuid.uuid4().hex
    p = start(tmp_path, "-m", "+exp=tiny_fake", NO_WANDB, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
              "backend.sleep_s=4.0", marker=marker)
    wait_for(lambda: len(processes_with(marker)) >= 3 and list(tmp_path.glob("tiny_fake/*/config.yaml")), 120,
             "the joblib workers to start cells")
    os.kill(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=120)  # the workers hold its pipes: this returns once they are gone too
    assert p.returncode == 143, err[-2000:]
    wait_for(lambda: not processes_with(marker), 30, "every loky worker and tracker to exit")
    # joblib kills its workers (SIGKILL): their cells' locks stay, as after kill -9, and the next
    # run breaks them (their owners are dead); no summary.json is half-written either way
    assert not list(tmp_path.glob("tiny_fake/*/error.txt"))


def test_kill_9_of_a_joblib_sweep_ends_its_workers(tmp_path):
    """issue 34 (4, 6): after a kill -9 of a `hydra/launcher=joblib` sweep its loky workers finished
    their cells and then idled until loky's timeout (300 s; still there after 60 s). Now they die
    with it (repro.lifeline, armed by the task function): the cells they ran are unwound, and
    neither a second stop signal nor a task loky had queued leaves a cell half-written."""
    for k in range(REPEAT):
        results, marker = tmp_path / f"run{k}", uuid.uuid4().hex
        p = start(results, "-m", "+exp=tiny_fake", NO_WANDB, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                  "backend.sleep_s=30.0", marker=marker)
        wait_for(lambda: len(processes_with(marker)) >= 3 and len(list(results.glob("tiny_fake/*/config.yaml"))) >= 2,
                 120, "both joblib workers to start a cell")
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=120)  # the workers hold its pipes: this returns once they are gone too
        wait_for(lambda: not processes_with(marker), 60, "every loky worker and tracker to exit")
        assert not list(results.glob("tiny_fake/*/summary.json"))  # killed mid-cell, not finished
        no_half_written_cells(results)


def test_kill_9_of_a_joblib_sweep_while_its_workers_start(tmp_path):
    """issue 41 (4): a kill -9 of a `hydra/launcher=joblib` sweep as soon as its loky workers exist
    (before or while they import the task): they were re-parented, `die_with_sweep` found another
    parent and returned unarmed, and they ran cells (or idled until loky's 300 s timeout) with their
    resource trackers. Now loky's initializer arms them on start, and a worker whose sweep is gone
    exits before any cell: no process is left and no cell file is written."""
    for k in range(REPEAT):
        results, marker = tmp_path / f"run{k}", uuid.uuid4().hex
        p = start(results, "-m", "+exp=tiny_fake", NO_WANDB, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                  "backend.sleep_s=30.0", marker=marker)
        wait_for(lambda: len(processes_with(marker)) >= 2 + k % 2, 120, "the loky workers to exist")
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=120)
        wait_for(lambda: not processes_with(marker), 60, "every loky worker and tracker to exit")
        assert not list(results.glob("tiny_fake/*/summary.json"))
        no_half_written_cells(results)


def _catches_sigint(pid: int) -> bool:
    """Python has installed its SIGINT handler (before that, SIGINT's default action ends the process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught & (1 << (signal.SIGINT - 1)))


@pytest.mark.parametrize("form", ["inprocess", "multirun"])
def test_ctrl_c_in_the_first_seconds_is_one_line(tmp_path, form):
    """issue 41 (5): a Ctrl-C while repro.run still imports printed a 22-102-line KeyboardInterrupt
    traceback and died of the signal. Now: exit 130 and one line, whenever it comes."""
    for k in range(REPEAT):
        results, marker = tmp_path / f"run{k}", uuid.uuid4().hex
        args = ["+exp=tiny_fake", NO_WANDB, "backend.sleep_s=2.0"]
        p = start(results, *(["-m", *args] if form == "multirun" else [*args, "n_jobs=1"]), marker=marker)
        wait_for(lambda: _catches_sigint(p.pid), 60, "the interpreter to handle SIGINT")
        _signal_group(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, (k, p.returncode, err[-3000:])
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
        assert "stopped (Ctrl-C)" in err


def test_a_double_ctrl_c_of_a_joblib_sweep_exits_130(tmp_path):
    """issue 41 (5): a second Ctrl-C of a `hydra/launcher=joblib` sweep could hang in loky's cleanup
    ('Popen' object has no attribute 'kill') or end it by the signal; now it exits 130 at once and
    its workers die with it."""
    for k in range(REPEAT):
        results, marker = tmp_path / f"run{k}", uuid.uuid4().hex
        p = start(results, "-m", "+exp=tiny_fake", NO_WANDB, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                  "backend.sleep_s=4.0", marker=marker)
        wait_for(lambda: len(processes_with(marker)) >= 3 and list(results.glob("tiny_fake/*/config.yaml")), 120,
                 "the joblib workers to start cells")
        _signal_group(p.pid, signal.SIGINT)
        _signal_group(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)  # the hang guard
        assert p.returncode == 130, (k, p.returncode, err[-3000:])
        assert "stopped (Ctrl-C)" in err, err[-3000:]
        wait_for(lambda: not processes_with(marker), 30, "every loky worker and tracker to exit")
