"""Workers that die with their parent from their first instruction (repro.harness.pool, and the
loky workers of `-m hydra/launcher=joblib`: repro.lifeline).

multiprocessing's spawn runs `python -c "from multiprocessing.spawn import spawn_main; ..."`,
which imports the parent's main module and the worker's target's package (1-3 s, more on a
loaded machine) before any code of ours runs: a parent killed with -9 meanwhile left the worker
alive until then. `BootProcess` is a spawn Process whose command line starts with `_BOOT`.
Tested by tests/reliability/test_worker_boot.py.
Once running, a worker is held by repro.lifeline.die_with_parent; joblib's loky workers, whose
command line is not ours, arm it in the first statement of repro.run's task function.
"""

from __future__ import annotations

import io
import os
from multiprocessing import popen_spawn_posix, resource_tracker, spawn, util
from multiprocessing.context import SpawnProcess, reduction, set_spawning_popen  # type: ignore[attr-defined]
from typing import Any

# The first statements of a spawned worker (`python -c`), before spawn_main imports the parent's
# main module and this package (1-3 s, more under load): die with the parent (SIGTERM, whose
# default action ends it while it imports), and end at once if the parent died before that.
_BOOT = (
    "import os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes; ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != {ppid}: os._exit(143)\n"
)


class BootPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn Popen with `_BOOT` before spawn_main on the command line."""

    def _launch(self, process_obj):  # popen_spawn_posix.Popen._launch, with our command line
        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = boot_command_line(os.getpid(), tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


def boot_command_line(ppid: int, **kwds: Any) -> list[str]:
    """spawn.get_command_line(**kwds) with `_BOOT` (for parent ppid) as the program's first lines."""
    cmd = spawn.get_command_line(**kwds)
    if "-c" not in cmd:  # a frozen executable: no program to prefix
        return cmd
    i = cmd.index("-c")
    return [*cmd[: i + 1], _BOOT.format(ppid=int(ppid)) + cmd[i + 1], *cmd[i + 2 :]]


def arm_loky_workers() -> None:
    """In a `-m` sweep's process: joblib's loky workers run repro.lifeline.arm_loky_worker as their
    initializer, on start, instead of only in the first task: a worker that never got a task (or was
    still importing it) when the sweep died lived on until loky's idle timeout (300 s). Hydra's joblib
    launcher names its backend "loky" and takes no initializer, so "loky" is registered again as
    joblib's LokyBackend with it (its constructor's backend_kwargs reach the executor)."""
    try:
        from joblib import register_parallel_backend
        from joblib._parallel_backends import LokyBackend
    except ImportError:  # no joblib: no loky workers
        return
    from repro.lifeline import arm_loky_worker

    class ArmedLokyBackend(LokyBackend):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("initializer", arm_loky_worker)
            super().__init__(*args, **kwargs)

    register_parallel_backend("loky", ArmedLokyBackend)
    # A sweep stopped by a second Ctrl-C ends with os._exit (repro.run): loky's resource tracker then
    # frees the executor's semaphores itself, which is its job, not a warning for the user.
    quiet = "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker"
    os.environ["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)


class BootProcess(SpawnProcess):
    _start_method = "spawn"

    @staticmethod
    def _Popen(process_obj):
        return BootPopen(process_obj)


__all__ = ["BootPopen", "BootProcess", "arm_loky_workers", "boot_command_line"]
