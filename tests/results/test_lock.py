"""repro.results.lock: one owner at a time, dead owners detected (same host by pid, others by heartbeat)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

from repro.results.lock import LOCK, CellLock, owner_record


def test_acquire_release_and_busy(tmp_path):
    a, b = CellLock(tmp_path), CellLock(tmp_path)
    assert a.try_acquire()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert not b.try_acquire() and b.held_by_other()
    a.release()
    assert not (tmp_path / LOCK).exists()
    assert b.try_acquire() and a.held_by_other()
    b.release()


def test_lock_of_a_dead_process_on_this_host_is_broken(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**owner_record(), "pid": int(proc.stdout), "start": "1"}
    (tmp_path / LOCK).write_text(json.dumps(dead))
    lock = CellLock(tmp_path)
    assert not lock.held_by_other()
    assert lock.try_acquire()
    assert json.loads((tmp_path / LOCK).read_text())["token"] == lock.owner["token"]
    lock.release()


def test_reused_pid_is_not_the_owner(tmp_path):
    me = {**owner_record(), "start": "123"}  # this pid, but another start time: the owner is gone
    (tmp_path / LOCK).write_text(json.dumps(me))
    assert CellLock(tmp_path).try_acquire()


def test_other_hosts_lock_judged_by_heartbeat_age(tmp_path):
    other = {**owner_record(), "host": "node-elsewhere", "boot_id": "x"}
    (tmp_path / LOCK).write_text(json.dumps(other))
    lock = CellLock(tmp_path, stale_after_s=60)
    assert not lock.try_acquire() and lock.held_by_other()  # fresh mtime: alive
    old = time.time() - 120
    os.utime(tmp_path / LOCK, (old, old))
    assert not lock.held_by_other() and lock.try_acquire()
    lock.release()


def test_heartbeat_touches_the_lock(tmp_path):
    lock = CellLock(tmp_path, heartbeat_s=0.05)
    assert lock.try_acquire()
    old = time.time() - 1000
    os.utime(tmp_path / LOCK, (old, old))
    time.sleep(0.3)
    assert time.time() - (tmp_path / LOCK).stat().st_mtime < 5
    lock.release()


def test_lock_being_written_counts_as_held(tmp_path):
    (tmp_path / LOCK).write_text("")  # created, content not yet written
    assert not CellLock(tmp_path).try_acquire()


def _race(path, ready, tried, results):
    lock = CellLock(path)
    ready.wait()  # every process started: they all try at once
    won = lock.try_acquire()
    results.put(won)
    tried.wait()  # the winner holds the lock until every process has tried (events, not a sleep)
    if won:
        lock.release()


def test_many_processes_one_winner(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    n = 6
    ready, tried, results = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path, ready, tried, results)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in range(n)]  # a generous bound against a hang only
    for p in procs:
        p.join(60)
    assert sorted(got) == [False] * (n - 1) + [True]
    assert not (tmp_path / LOCK).exists()


def test_two_breakers_of_one_dead_lock_one_wins(tmp_path):
    other = {**owner_record(), "host": "gone", "boot_id": "x"}
    (tmp_path / LOCK).write_text(json.dumps(other))
    old = time.time() - 10_000
    os.utime(tmp_path / LOCK, (old, old))
    a, b = CellLock(tmp_path), CellLock(tmp_path)
    assert a.try_acquire()
    assert not b.try_acquire()  # sees a's fresh lock, not the dead one
    assert a.still_mine()


def _interrupt_self():
    import signal

    os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at the next bytecode it may


def test_a_stop_right_after_the_create_leaves_the_lock_owned(tmp_path, monkeypatch):
    """issue 34 (6): a stop between creating the file and recording it as ours orphaned it."""
    import repro.results.lock as lock_mod

    real_open = os.open

    def open_then_interrupt(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        _interrupt_self()  # the chosen point: the file exists, it is not yet recorded as ours
        return fd

    monkeypatch.setattr(lock_mod.os, "open", open_then_interrupt)
    lock = CellLock(tmp_path / "cell")
    try:
        lock.try_acquire()
        raise AssertionError("the interrupt never came")
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(lock_mod.os, "open", real_open)
    assert lock.owner is not None and lock.still_mine()  # ours, so the unwinding releases it
    lock.release()
    assert not (tmp_path / "cell").exists()  # lock and the folder it made: gone


def test_a_stop_inside_release_still_unlinks(tmp_path, monkeypatch):
    lock = CellLock(tmp_path / "cell")
    assert lock.try_acquire()
    (tmp_path / "cell" / "summary.json").write_text("{}")
    real = CellLock.still_mine

    def mine_then_interrupt(self):
        _interrupt_self()  # the chosen point: between the ownership check and the unlink
        return real(self)

    monkeypatch.setattr(CellLock, "still_mine", mine_then_interrupt)
    try:
        lock.release()
        raise AssertionError("the interrupt never came")
    except KeyboardInterrupt:
        pass
    assert not (tmp_path / "cell" / LOCK).exists() and lock.owner is None
    assert (tmp_path / "cell" / "summary.json").exists()  # a folder with files stays


def test_a_full_disk_leaves_no_lock(tmp_path, monkeypatch):
    """issue 41 (7): ENOSPC while the owner record was written left a 0-byte .lock that stalled the
    next run for ~120 s. Now the create removes its file before the error goes on."""
    import errno

    import pytest

    from repro.results import lock as lock_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lock_mod.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        CellLock(tmp_path).try_acquire()
    assert not (tmp_path / LOCK).exists()


def test_an_empty_lock_is_broken_at_once_with_a_warning(tmp_path, caplog):
    (tmp_path / LOCK).write_bytes(b"")
    past = time.time() - 5  # older than a create-then-write takes (EMPTY_AFTER_S), far below the heartbeat limit
    os.utime(tmp_path / LOCK, (past, past))
    lock = CellLock(tmp_path)
    with caplog.at_level("WARNING", logger="repro.results.lock"):
        assert lock.try_acquire()
    assert "empty lock" in caplog.text and str(tmp_path / LOCK) in caplog.text
    lock.release()


def test_a_lock_being_written_is_not_broken(tmp_path):
    (tmp_path / LOCK).write_bytes(b"")  # just created: its owner writes it within microseconds
    soon = time.time() + 60  # "just now" whatever the load of the machine
    os.utime(tmp_path / LOCK, (soon, soon))
    assert not CellLock(tmp_path).try_acquire()
