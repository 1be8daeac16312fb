"""A process that dies with its parent (stdlib only: cheap to import first).

- `die_with_parent(ppid)`: the in-process sweep's pool workers (repro.harness.pool) once running
  (their command line armed PR_SET_PDEATHSIG even before: repro.harness.boot).
- `mark_sweep_process()` / `die_with_sweep()`: joblib's loky workers of `-m hydra/launcher=joblib`
  run `python -m joblib.externals.loky...`, a command line that is not ours, and get repro.run's
  task function by value (it lives in __main__): its first statement, `die_with_sweep()`, arms a
  process whose parent is the `-m` sweep's process (named in SWEEP_ENV). Without it a kill -9 of
  the sweep left them running until loky's idle timeout (300 s). Slurm jobs (parent: slurmstepd)
  and submitit's local jobs (parent: its controller) are not children of the sweep's process:
  they finish the cell they run, as a submitted job does. The loky workers are armed twice: by
  loky's worker initializer (repro.harness.boot.arm_loky_workers: before they wait for a task) and
  by the task function; a loky worker whose sweep is already gone exits there.
Tested by tests/reliability/test_worker_boot.py and test_reliability.py.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

SWEEP_ENV = "REPRO_SWEEP_PROCESS"  # "pid:start time" of a `-m` sweep's process
STOP_GRACE_S = 10.0  # after SIGTERM, the watchdog ends a process that has not ended itself
_armed: list[int] = []


def die_with_parent(ppid: int) -> None:
    """One SIGTERM when the parent dies (PR_SET_PDEATHSIG on Linux; elsewhere a watchdog thread that
    compares getppid() sends it), and os._exit(143) STOP_GRACE_S later if the process is still there
    (a worker whose parent is gone has nobody else to end it). Idempotent."""
    if _armed:
        return
    _armed.append(ppid)
    by_kernel = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            by_kernel = ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM) == 0  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != ppid:  # it died before the prctl: the kernel will not signal
        by_kernel = False

    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(0.5)
        if not by_kernel:  # one signal only: a second one could land inside the first one's unwinding
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os._exit(143)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc cannot tell): with the pid,
    it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def mark_sweep_process() -> None:
    """Name this process, for the launcher's workers it starts, as the one to die with."""
    os.environ[SWEEP_ENV] = f"{os.getpid()}:{_start_time(os.getpid())}"


def orphaned() -> bool:
    """Armed, and the parent it was armed for is gone."""
    return bool(_armed) and os.getppid() != _armed[0]


def die_with_sweep(loky_worker: bool = False) -> bool:
    """In a child of the process that `mark_sweep_process` named: die with it. True if armed.
    A worker whose sweep is already gone ends here instead of starting its next task (and a loky
    worker, `loky_worker` or named so by loky, whose sweep died before this ran exits at once)."""
    if _armed:
        if orphaned():
            os._exit(143)
        return True
    pid, _, started = os.environ.get(SWEEP_ENV, "").partition(":")
    if not pid.isdigit() or int(pid) == os.getpid():  # (the marked process itself is not its own child)
        return False
    if os.getppid() != int(pid) or started != _start_time(int(pid)):
        # A loky worker whose sweep died before this ran was re-parented: it must not start a cell.
        # (Slurm and submitit jobs are no loky workers: they finish what they run.)
        if (loky_worker or _is_loky_worker()) and not _alive(int(pid), started):
            os._exit(143)
        return False
    die_with_parent(int(pid))
    return True


def _alive(pid: int, started: str) -> bool:
    """The process named by (pid, start time) still runs: not gone, not another one, not a zombie
    (a killed sweep stays one until its parent reaps it, which may wait on the workers' pipes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and fields[19] == started


def _is_loky_worker() -> bool:
    """loky names its workers' process objects (`--process-name LokyProcess-N`); its start-up swaps
    __main__ for the parent's main module, so that one cannot tell."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.current_process().name.startswith("LokyProcess")


def arm_loky_worker() -> None:
    """loky's worker initializer in a `-m` sweep (repro.harness.boot.arm_loky_workers)."""
    die_with_sweep(loky_worker=True)


__all__ = ["SWEEP_ENV", "arm_loky_worker", "die_with_parent", "die_with_sweep", "mark_sweep_process", "orphaned"]
